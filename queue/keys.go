package queue

import "strings"

// Keys are the Redis keys of one bucket. They share the hash tag {name}, so
// on Redis Cluster they live in one slot and the scripts may touch them all.
type Keys struct {
	Queue string // list of waiting caller IDs
	State string // string "seq l1 a1 ...": ticket counter, then level and anchor of each policy
	Slots string // sorted set: caller ID -> slot (µs, Redis time)
	Lock  string // the scheduler's lock
	Wake  string // pub/sub channel: callers whose slot came early
}

// NewKeys returns the keys of the bucket name under prefix:
// "<prefix>:{<name>}:<suffix>". The name is escaped so that any byte string
// is a valid name, no two names share keys, and no name can end the hash tag
// early: '%', '{' and '}' become "%25", "%7B" and "%7D".
func NewKeys(prefix, name string) Keys {
	base := prefix + ":{" + EscapeName(name) + "}:"
	return Keys{
		Queue: base + "queue",
		State: base + "state",
		Slots: base + "slots",
		Lock:  base + "lock",
		Wake:  base + "wake",
	}
}

var nameEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeName percent-encodes '%', '{' and '}' in name. It is injective: two
// different names never escape to the same string.
func EscapeName(name string) string { return nameEscaper.Replace(name) }

func (k Keys) list() []string { return []string{k.Queue, k.State, k.Slots, k.Lock} }
