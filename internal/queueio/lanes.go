package queueio

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// MaxLaneRows is how many lanes a Snapshot lists, those with the most
// callers; the others are summed (Snapshot.OtherLanes, OtherQueued).
const MaxLaneRows = 20

// LaneQueue is one lane with callers in a Snapshot.
type LaneQueue struct {
	Name     string // "" for the default lane
	Priority int
	Queued   int64 // its callers, in every process
	// ClassLanes is how many lanes of its priority have callers, its own
	// included: a new caller of the lane has its lane's callers ahead of
	// it that many times over (queue/lua/estimate.lua).
	ClassLanes int64
}

// lanesSnapshot is what lanes.lua read.
type lanesSnapshot struct {
	defaultQueued, defaultLanes, named int64
	rows                               []LaneQueue
	others, othersQueued               int64
}

//go:embed lanes.lua
var lanesLua string

var lanesScript = protocol.Script(lanesLua, protocol.TokensLua, protocol.EntryLua, protocol.LanesLua)

// readLanes reads the lanes with callers of the bucket of keys, at most
// top of them listed, in one script that only reads.
func readLanes(ctx context.Context, rdb Client, keys Keys, top int) (lanesSnapshot, error) {
	v, err := lanesScript.Run(ctx, rdb, append([]string{keys.Queue}, keys.Lanes()...), top).Result()
	if err != nil {
		return lanesSnapshot{}, err
	}
	return parseLanes(v)
}

// parseLanes checks and reads lanes.lua's reply.
func parseLanes(v any) (lanesSnapshot, error) {
	bad := func(what string) (lanesSnapshot, error) {
		return lanesSnapshot{}, fmt.Errorf("%w: lanes.lua returned %s: %v", scriptreply.ErrReply, what, v)
	}
	r, ok := v.([]any)
	if !ok || len(r) < 5 || (len(r)-5)%4 != 0 {
		return bad("a reply of another shape")
	}
	var head [5]int64
	for i := range head {
		if head[i], ok = r[i].(int64); !ok || head[i] < 0 {
			return bad("a count that is not one")
		}
	}
	s := lanesSnapshot{defaultQueued: head[0], defaultLanes: head[1], named: head[2], others: head[3], othersQueued: head[4]}
	for i := 5; i < len(r); i += 4 {
		name, ok1 := r[i].(string)
		p, ok2 := r[i+1].(int64)
		q, ok3 := r[i+2].(int64)
		n, ok4 := r[i+3].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || p < 0 || q <= 0 || n <= 0 {
			return bad("a lane's row that is not one")
		}
		s.rows = append(s.rows, LaneQueue{Name: name, Priority: int(p), Queued: q, ClassLanes: n})
	}
	return s, nil
}
