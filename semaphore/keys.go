package semaphore

import "strings"

// Key suffixes. Every key of one semaphore is <prefix>:{<escaped name>}:<suffix>,
// so they all share one hash tag (one Redis Cluster slot) and an ACL pattern
// such as ~sluice:* covers them.
const (
	suffixLeases = "leases" // ZSET holder or waiter id -> lease expiry (µs, Redis TIME)
	suffixQueue  = "queue"  // ZSET waiter id -> ticket (arrival order)
	suffixSeq    = "seq"    // STRING last ticket handed out
	suffixWake   = "wake"   // pub/sub channel prefix; one channel per process
)

// escapeName percent-encodes '%', '{' and '}' so that any byte string is a
// valid name, the hash tag ends exactly where the name ends, and two
// different names never yield the same keys.
func escapeName(name string) string {
	if !strings.ContainsAny(name, "%{}") {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 8)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// keyBase is "<prefix>:{<escaped name>}:", the common start of every key and
// channel of one semaphore.
func keyBase(prefix, name string) string {
	return prefix + ":{" + escapeName(name) + "}:"
}
