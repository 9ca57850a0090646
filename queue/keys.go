package queue

import (
	"github.com/sluicehq/sluice/internal/rediskey"
)

// Keys are the Redis keys of one bucket: "<prefix>:{<escaped name>}:<suffix>".
// They share the hash tag, so on Redis Cluster they live in one slot and the
// scripts may touch them all. The keys only this package's scripts name
// (the state, the config, the refunds, the windows) are unexported.
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

	state string // string "done until level anchor ...": internal/protocol/state.go
	// config is the configuration in force, "<format> <id> <json>"
	// (internal/protocol/config.go), with a TTL of 30 days renewed while
	// the bucket is used: the limit outlives an idle bucket.
	config string
	// refunds counts the upstream's answers that moved the bucket's
	// refills (holds, syncs: lua/feedback.lua) and, per policy, the tokens
	// late callers gave back ("d,r1,r2,...": lua/retime.lua), so that each
	// give-back can tell whether it is exact; it lives a while after the
	// last change.
	refunds string
	// due is the sorted set of the slots written and not yet collected,
	// of callers of the bucket's own costs: member the caller's entry,
	// score its slot (µs): internal/protocol/claim.lua.
	due string
	// window is the prefix of the logs of the bucket's rolling windows:
	// the list window+"<i>" (1-based) holds policy i's grants, "slot
	// cost" (internal/protocol/tokens.lua, "Windows").
	window string
}

func newKeys(prefix, name string) Keys {
	base := rediskey.Base(prefix, name)
	return Keys{
		Queue:   base + "queue",
		state:   base + "state",
		Slot:    base + "slot:",
		Lock:    base + "lock",
		Wake:    base + "wake",
		config:  base + "config",
		refunds: base + "refunds",
		window:  base + "window:",
		due:     base + "due",
		Procs:   base + "procs",
	}
}

// list is KEYS of the scripts that need them all: the queue, the state,
// the prefix of the slot keys (declared so that Redis Cluster routes and
// checks it like the keys made from it, which share its hash tag), the
// lock, the config, the refunds and the due set.
func (k Keys) list() []string {
	return []string{k.Queue, k.state, k.Slot, k.Lock, k.config, k.refunds, k.due}
}

// retime is KEYS of lua/retime.lua, lua/settle.lua and lua/feedback.lua:
// arrival's, the refunds, and (retime.lua's claims) the slot keys' prefix
// and the due set.
func (k Keys) retime() []string {
	return []string{k.Queue, k.state, k.config, k.refunds, k.Slot, k.due}
}

// List is the keys a scheduler step names (package scheduler).
func (k Keys) List() []string { return k.list() }

// arrival is KEYS of the scripts that need only the queue, the state and
// the config (enqueue.lua, estimate.lua).
func (k Keys) arrival() []string { return []string{k.Queue, k.state, k.config} }

// enqueue is KEYS of lua/enqueue.lua: arrival's, then the slot keys'
// prefix, the refunds and the due set, for its help (a late scheduler's
// step).
func (k Keys) enqueue() []string {
	return []string{k.Queue, k.state, k.config, k.Slot, k.refunds, k.due}
}
