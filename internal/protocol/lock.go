package protocol

import (
	"os"
	"strconv"
	"strings"
)

// The scheduler lock's value is "<token> <host>:<pid>": the redislock
// token, which step.lua compares whole with the token plus metadata its
// caller passes (ARGV[1], the fence), then the process that holds it, so
// that an operator can tell which process runs a bucket's scheduler
// (bucket.Inspect).

// LockMetadata is this process's part of the lock's value, after the token
// (a redislock Metadata): " <host>:<pid>".
var LockMetadata = func() string {
	h, err := os.Hostname()
	if err != nil {
		h = "?"
	}
	return " " + h + ":" + strconv.Itoa(os.Getpid())
}()

// LockHolder reads the process a lock's value names (LockMetadata): ""
// when it names none.
func LockHolder(lockValue string) string {
	_, h, _ := strings.Cut(lockValue, " ")
	return h
}
