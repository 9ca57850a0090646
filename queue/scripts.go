package queue

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/enqueue.lua
	enqueueLua string
	//go:embed lua/step.lua
	stepLua string
	//go:embed lua/poll.lua
	pollLua string
	//go:embed lua/cancel.lua
	cancelLua string
)

// Each script is the shared library followed by its own body, so the pure
// functions in lib.lua are the very code that runs in production.
var (
	enqueueScript = redis.NewScript(libLua + enqueueLua)
	stepScript    = redis.NewScript(libLua + stepLua)
	pollScript    = redis.NewScript(libLua + pollLua)
	cancelScript  = redis.NewScript(cancelLua)
	allScripts    = []*redis.Script{enqueueScript, stepScript, pollScript, cancelScript}
)

// LibLua is the source of the pure functions shared by the scripts (refill,
// slot_for, ...), for tests that drive them on fake instants.
func LibLua() string { return libLua }
