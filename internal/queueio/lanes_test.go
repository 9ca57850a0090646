package queueio

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/scriptreply"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestReadLanes holds lanes.lua against the lanes' layout written by
// hand (internal/protocol/lanes.lua writes the same): the lanes with
// callers, the most first, the default lane among them, a lane whose list
// is empty (expired) left out but counted in its class as estimate.lua
// counts it, and the lanes past top summed.
func TestReadLanes(t *testing.T) {
	rdb := redistest.New(t).Client()
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	k := NewKeys("test", t.Name())

	s, err := readLanes(ctx, rdb, k, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := (lanesSnapshot{defaultLanes: 1}); !reflect.DeepEqual(s, want) {
		t.Errorf("no caller: %+v, want %+v", s, want)
	}

	push := func(key string, n int) {
		for i := range n {
			rdb.RPush(ctx, key, fmt.Sprintf("id%d|0", i))
		}
	}
	push(k.Queue, 2)
	// Class 0: a (3 callers), b (1), gone (its list expired); class 5: u (2).
	push(k.LaneQueue+"a", 3)
	push(k.LaneQueue+"b", 1)
	push(k.LaneQueue+"u", 2)
	rdb.ZAdd(ctx, k.Class+"0", redisZ("a", 1), redisZ("b", 2), redisZ("gone", 3))
	rdb.ZAdd(ctx, k.Class+"5", redisZ("u", 1))
	rdb.ZAdd(ctx, k.Classes, redisZ("0", 0), redisZ("5", -5))

	if s, err = readLanes(ctx, rdb, k, 3); err != nil {
		t.Fatal(err)
	}
	// Class 0 has a, b, gone and the default lane: 4 lanes.
	want := lanesSnapshot{defaultQueued: 2, defaultLanes: 4, named: 6, others: 1, othersQueued: 1, rows: []LaneQueue{
		{Name: "a", Priority: 0, Queued: 3, ClassLanes: 4},
		{Name: "u", Priority: 5, Queued: 2, ClassLanes: 1},
		{Name: "", Priority: 0, Queued: 2, ClassLanes: 4},
	}}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("lanes:\n got %+v\nwant %+v", s, want)
	}
	if s, err = readLanes(ctx, rdb, k, 0); err != nil || len(s.rows) != 0 || s.others != 4 || s.othersQueued != 8 {
		t.Errorf("top 0: %+v, %v; want no row, 4 lanes of 8 callers summed", s, err)
	}
}

// TestParseLanes: a reply of another shape is an error, not a guess.
func TestParseLanes(t *testing.T) {
	for _, v := range []any{
		"x",
		[]any{int64(0), int64(1), int64(0), int64(0)},
		[]any{int64(0), int64(1), int64(0), int64(0), int64(-1)},
		[]any{int64(0), int64(1), int64(1), int64(0), int64(0), "a", int64(0), int64(1)},
		[]any{int64(0), int64(1), int64(1), int64(0), int64(0), "a", int64(0), int64(0), int64(1)},
		[]any{int64(0), int64(1), int64(1), int64(0), int64(0), int64(7), int64(0), int64(1), int64(1)},
	} {
		if _, err := parseLanes(v); !errors.Is(err, scriptreply.ErrReply) {
			t.Errorf("parseLanes(%v) = %v, want ErrReply", v, err)
		}
	}
}

func redisZ(member string, score float64) redis.Z { return redis.Z{Member: member, Score: score} }
