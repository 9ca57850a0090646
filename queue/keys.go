package queue

import "strings"

// Keys are the Redis keys of one bucket. They share the hash tag {name}, so
// on Redis Cluster they live in one slot and the scripts may touch them all.
type Keys struct {
	Queue string // list of waiting callers' entries, "<id>|<estimate>"
	State string // string "done until l1 a1 ...": see load in lua/lib.lua
	// Slot is the prefix of the slot keys: the scheduler writes a caller's
	// slot (µs, Redis time) to the string Slot+"<id>", and the caller's
	// poll reads and deletes it (GETDEL). One key per scheduled caller, so
	// a poll is one plain command, not a script, and each key expires on
	// its own.
	Slot string
	Lock string // the scheduler's lock
	Wake string // pub/sub channel: callers whose slot came early
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
		Slot:  base + "slot:",
		Lock:  base + "lock",
		Wake:  base + "wake",
	}
}

var nameEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeName percent-encodes '%', '{' and '}' in name. It is injective: two
// different names never escape to the same string.
func EscapeName(name string) string { return nameEscaper.Replace(name) }

// SlotKey is the key that holds the slot of the caller known by entry
// ("<id>|<estimate>") or by its bare ID.
func (k Keys) SlotKey(entry string) string {
	id, _, _ := strings.Cut(entry, "|")
	return k.Slot + id
}

// SlotPattern is a SCAN MATCH pattern for every slot key of the bucket:
// the glob characters of the prefix are escaped.
func (k Keys) SlotPattern() string {
	return globEscaper.Replace(k.Slot) + "*"
}

var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// list is KEYS of every script: the queue, the state, the prefix of the
// slot keys (declared so that Redis Cluster routes and checks it like the
// keys made from it, which share its hash tag), and the lock.
func (k Keys) list() []string { return []string{k.Queue, k.State, k.Slot, k.Lock} }
