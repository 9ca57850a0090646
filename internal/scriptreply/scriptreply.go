// Package scriptreply reads the replies of the module's scripts: lists of
// integers, the time units the scripts count in, and the errors they
// raise, as real Redis and miniredis each return them.
package scriptreply

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrReply reports a Redis reply of an unexpected shape.
var ErrReply = errors.New("unexpected reply from Redis")

// Ints checks that a script reply is a list of integers and returns them.
func Ints(v any, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T where a list belongs", ErrReply, v)
	}
	out := make([]int64, len(list))
	for i, e := range list {
		n, ok := e.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: element %d is %T, not an integer", ErrReply, i, e)
		}
		out[i] = n
	}
	return out, nil
}

// Micros is d in whole microseconds, the unit of every duration the
// scripts read.
func Micros(d time.Duration) int64 { return d.Microseconds() }

// Dur converts a reply's count of unit into a Duration, saturating instead
// of wrapping past ±292 years (a valid config can ask for longer).
func Dur(n int64, unit time.Duration) time.Duration {
	const maxDur = time.Duration(1<<63 - 1)
	switch {
	case n > int64(maxDur/unit):
		return maxDur
	case n < -int64(maxDur/unit):
		return -maxDur
	}
	return time.Duration(n) * unit
}

// Raised returns the message a script raised with error(msg, 0), and
// whether err is such an error. Scripts raise strings, never tables
// ({err = ...}), which miniredis turns into "table: 0x...". The two
// servers wrap a raised string differently:
//
//	Redis 7:   ERR <msg> script: <sha1>, on @user_script:<line>.
//	miniredis: ERR Error compiling script (new function): <msg>\nstack traceback: ...
//
// (miniredis writes its newlines as spaces.) Redis 6.2 wraps it as "ERR
// Error running script (call to f_<sha1>): @user_script:<line>: <msg>",
// which Raised reads too. A raise at level 1 (error(msg), which prefixes
// the script's position) is not read, nor is a failed redis.call, which
// miniredis raises that way.
func Raised(err error) (msg string, ok bool) {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return "", false
	}
	msg, ok = strings.CutPrefix(rerr.Error(), "ERR ")
	if !ok {
		return "", false
	}
	m := redis7Raise.FindStringSubmatch(msg)
	if m == nil {
		m = redis6Raise.FindStringSubmatch(msg)
	}
	mini, isMini := strings.CutPrefix(msg, miniRaise)
	switch {
	case m != nil:
		msg = m[1]
	case isMini:
		msg = mini
		for _, sep := range []string{"\nstack traceback:", " stack traceback:"} {
			if i := strings.Index(msg, sep); i >= 0 {
				msg = msg[:i]
				break
			}
		}
	default:
		return "", false
	}
	if positioned.MatchString(msg) {
		return "", false
	}
	return msg, true
}

var (
	redis7Raise = regexp.MustCompile(`(?s)^(.*) script: [0-9a-f]{40}, on @user_script:\d+\.$`)
	redis6Raise = regexp.MustCompile(`(?s)^Error running script \(call to f_[0-9a-f]{40}\): @user_script:\d+: (.*?)\s*$`)
	miniRaise   = "Error compiling script (new function): "
	// positioned is the position error(msg) puts before msg: Redis's
	// "user_script:3: ", miniredis's ":3: " (its scripts have no name).
	positioned = regexp.MustCompile(`^(?:user_script|<string>)?:\d+: `)
)
