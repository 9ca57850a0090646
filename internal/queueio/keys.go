package queueio

import "github.com/sluicehq/sluice/internal/rediskey"

// Keys are the Redis keys of one bucket: "<prefix>:{<escaped name>}:<suffix>".
// They share the hash tag, so on Redis Cluster they live in one slot and the
// scripts may touch them all. Each script's KEYS are built beside it
// (queue/keys.go; scheduler/step.go takes All).
type Keys struct {
	Queue string // list of waiting callers' entries, "<id>|<estimate>"
	// Slot is the prefix of the slot keys: the scheduler writes a caller's
	// slot (µs, Redis time) to the string Slot+"<id>", and the caller's
	// poll reads and deletes it (GETDEL). One key per scheduled caller, so
	// a poll is one plain command, not a script, and each key expires on
	// its own.
	Slot string
	Lock string // the scheduler's lock (github.com/bsm/redislock)
	Wake string // pub/sub channel: callers told their slot by the scheduler
	// Procs is the sorted set of the handles that used the bucket
	// recently, for the local share of bucket.Config.Fallback
	// (internal/presence).
	Procs string

	State string // string "done until level anchor ...": internal/protocol/state.go
	// Config is the configuration in force, "<format> <id> <json>"
	// (internal/protocol/config.go), with a TTL of 30 days renewed while
	// the bucket is used: the limit outlives an idle bucket.
	Config string
	// Refunds counts the upstream's answers that moved the bucket's
	// refills (holds, syncs: queue/lua/feedback.lua) and, per policy, the
	// tokens late callers gave back ("d,r1,r2,...": queue/lua/retime.lua),
	// so that each give-back can tell whether it is exact; it lives a
	// while after the last change.
	Refunds string
	// Due is the sorted set of the slots written and not yet collected,
	// of callers of the bucket's own costs: member the caller's entry,
	// score its slot (µs): internal/protocol/claim.lua.
	Due string
	// Window is the prefix of the logs of the bucket's rolling windows:
	// the list Window+"<i>" (1-based) holds policy i's grants, "slot
	// cost" (internal/protocol/tokens.lua, "Windows").
	Window string

	// The lanes (bucket.WithLane; internal/protocol/lanes.lua): LaneQueue
	// is the prefix of the named lanes' lists (LaneQueue+"<lane>"; the
	// default lane's list is Queue), Classes the sorted set of the
	// priority classes whose named lanes have callers, Class the prefix of
	// each class's sorted set of lanes (Class+"<priority>"), LaneTags the
	// hash of their fair-queueing tags.
	LaneQueue, Classes, Class, LaneTags string
}

// NewKeys returns the keys of the bucket name under prefix.
func NewKeys(prefix, name string) Keys {
	base := rediskey.Base(prefix, name)
	return Keys{
		Queue:   base + "queue",
		State:   base + "state",
		Slot:    base + "slot:",
		Lock:    base + "lock",
		Wake:    base + "wake",
		Config:  base + "config",
		Refunds: base + "refunds",
		Window:  base + "window:",
		Due:     base + "due",
		Procs:   base + "procs",

		LaneQueue: base + "lane:",
		Classes:   base + "lanes",
		Class:     base + "lanes:",
		LaneTags:  base + "lanetags",
	}
}

// All is KEYS of the scripts that need them all (queue/lua/poll.lua,
// scheduler/lua/step.lua): the queue, the state, the prefix of the slot
// keys (declared so that Redis Cluster routes and checks it like the keys
// made from it, which share its hash tag), the lock, the config, the
// refunds and the due set, then the lanes' keys (Lanes).
func (k Keys) All() []string {
	return append([]string{k.Queue, k.State, k.Slot, k.Lock, k.Config, k.Refunds, k.Due}, k.Lanes()...)
}

// Lanes is the lanes' keys as the scripts take them, after their others:
// the prefix of the named lanes' lists, the classes, the prefix of the
// classes' sets and the tags.
func (k Keys) Lanes() []string {
	return []string{k.LaneQueue, k.Classes, k.Class, k.LaneTags}
}
