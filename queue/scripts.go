package queue

import (
	_ "embed"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
)

var (
	//go:embed lua/enqueue.lua
	enqueueLua string
	//go:embed lua/fast.lua
	fastLua string
	//go:embed lua/poll.lua
	pollLua string
	//go:embed lua/cancel.lua
	cancelLua string
	//go:embed lua/estimate.lua
	estimateLua string
	//go:embed lua/retime.lua
	retimeLua string
	//go:embed lua/refund.lua
	refundLua string
)

var (
	enqueueScript  = protocol.Script(enqueueLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.LanesLua, protocol.WakeLua, protocol.ScheduleLua)
	fastScript     = redis.NewScript(fastLua)
	pollScript     = protocol.Script(pollLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.LanesLua, protocol.WakeLua, refundLua, protocol.ClaimLua, protocol.ScheduleLua)
	cancelScript   = protocol.Script(cancelLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.LanesLua, protocol.WakeLua, refundLua)
	estimateScript = protocol.Script(estimateLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.LanesLua)
	retimeScript   = protocol.Script(retimeLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, refundLua, protocol.ClaimLua)
)
