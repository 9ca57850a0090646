package protocol

import (
	"strconv"
	"strings"
)

// Wake is one caller named in a wake message: its entry and its slot (µs,
// Redis clock).
type Wake struct {
	Entry string
	Slot  int64
}

// FormatWake is the message wake.lua's wake_add and wake_publish send.
func FormatWake(ws []Wake) string {
	parts := make([]string, 0, 2*len(ws))
	for _, w := range ws {
		parts = append(parts, w.Entry, strconv.FormatInt(w.Slot, 10))
	}
	return strings.Join(parts, " ")
}

// ParseWake reads a wake message, calling f for each caller it names. An
// unreadable slot is reported as 1 (long past): its caller polls at once,
// which is always safe.
func ParseWake(payload string, f func(entry string, slot int64)) {
	fields := strings.Fields(payload)
	for i := 0; i+1 < len(fields); i += 2 {
		slot, err := strconv.ParseInt(fields[i+1], 10, 64)
		if err != nil || slot <= 0 {
			slot = 1
		}
		f(fields[i], slot)
	}
}

// ConfigNotice reads a message of wake.lua's config_notice: the id of the
// configuration a live change put in force.
func ConfigNotice(payload string) (id string, ok bool) {
	return strings.CutPrefix(payload, "config ")
}

// HandoverNotice is the message a process publishes on a bucket's wake
// channel when it releases the scheduler lock while callers may still wait
// (it closes, or has no caller of its own queued): every process with a
// caller queued tries to take the lock at once, rather than waiting for
// its callers' next poll.
const HandoverNotice = "handover"
