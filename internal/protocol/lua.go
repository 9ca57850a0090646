package protocol

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua parts, for Script. Each declares local functions only; a part
// may use the parts before it (StateLua needs TokensLua).
var (
	//go:embed tokens.lua
	TokensLua string
	// StateLua is the state string's code: peaks.lua, then state.lua,
	// whose save keeps the peaks.
	StateLua = peaksLua + stateLua
	//go:embed state.lua
	stateLua string
	//go:embed peaks.lua
	peaksLua string
	//go:embed entry.lua
	EntryLua string
	//go:embed wake.lua
	WakeLua string
	//go:embed claim.lua
	ClaimLua string
	//go:embed schedule.lua
	ScheduleLua string
	// LanesLua is who goes first (lanes.lua); it needs TokensLua and
	// EntryLua, and ScheduleLua needs it.
	//go:embed lanes.lua
	LanesLua string
)

// Script returns the script made of parts followed by body, so the
// functions a script calls are the very code the tests drive. A script
// takes only the parts it calls: each function defined costs Redis a little
// on every call.
func Script(body string, parts ...string) *redis.Script {
	src := ""
	for _, p := range parts {
		src += p
	}
	return redis.NewScript(src + body)
}
