package semaphore

import "github.com/sluicehq/sluice/internal/rediskey"

// Key suffixes. Every key of one semaphore is <prefix>:{<escaped name>}:<suffix>,
// so they all share one hash tag (one Redis Cluster slot) and an ACL pattern
// such as ~sluice:* covers them.
const (
	suffixLeases  = "leases"  // ZSET holder or waiter id -> lease expiry (µs, Redis TIME)
	suffixQueue   = "queue"   // ZSET waiter id -> ticket (arrival order)
	suffixSeq     = "seq"     // STRING last ticket handed out
	suffixWeights = "weights" // HASH holder id -> weight, for weights above 1 only
	suffixConfig  = "config"  // HASH format, capacity in force (stored.go)
	suffixWake    = "wake"    // pub/sub channel prefix; one channel per process
	suffixProcs   = "procs"   // ZSET handle -> its last trace (ms, Redis TIME), with Config.Fallback (internal/presence)

	// suffixLanes starts the keys of the lanes (WithLane; lanes.lua),
	// named as a bucket's, which the scripts make from it:
	//   lane:<lane>       ZSET a named lane's waiter id -> ticket
	//   lanes             ZSET the priority classes whose named lanes have waiters
	//   lanes:<priority>  ZSET the class's lanes with waiters -> head's finish tag
	//   lanetags          HASH the fair-queueing tags
	//   lanewaits         ZSET a named lane's waiter id -> lease expiry (µs, Redis TIME)
	suffixLanes = "lane"
)

// keyBase is "<prefix>:{<escaped name>}:", the common start of every key and
// channel of one semaphore (rediskey.Base, as a bucket's).
func keyBase(prefix, name string) string { return rediskey.Base(prefix, name) }
