// Package protocol is what the Go side and the Lua side of the token bucket
// share: the token arithmetic, and the three formats that cross between
// them (a queue entry, the state string, a wake message). Each is one .lua
// file, prepended to the scripts that need it (Script), next to the one Go
// file that builds and parses the same thing; the tests run the Lua and the
// Go side by side on the same inputs.
//
//	tokens.lua / tokens.go  refill and slot arithmetic of a policy
//	state.lua  / state.go   the state key: "done until level anchor ..."
//	entry.lua  / entry.go   a queue entry: "<id>|<estimate µs>"
//	wake.lua   / wake.go    a wake message: "<entry> <slot µs> ...", or
//	                        a live change's notice: "config <id>"
//	(state.lua)/ config.go  the config key: "<format> <id> <json>"
//	(step.lua) / lock.go    the scheduler lock's value: "<token> <host>:<pid>"
//
// Packages queue (arrivals, polls, cancels) and scheduler (the step) run the
// scripts; nothing here talks to Redis.
package protocol
