package queue

import (
	"encoding/binary"
	"errors"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The reply parsers take whatever go-redis decoded from a script's reply:
// int64, string, []any (nested), nil, or an error. These fuzz targets build
// such values from bytes and check that no input makes a parser panic and
// that what a parser accepts is within its documented ranges. Their seed
// corpus (well-formed replies and a few broken ones) runs in every go test;
// go test -fuzz=FuzzParsers ./queue explores further.

// decodeReply turns fuzz bytes into a reply value. Tags: 0 int64 (8 bytes),
// 1 small int (1 byte, signed), 2 string (length byte), 3 list (count byte,
// then elements), 4 nil, 5 float64 (a type go-redis never returns for
// scripts, to check it is refused).
func decodeReply(b []byte, depth int) (any, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	tag, b := b[0]%6, b[1:]
	switch tag {
	case 0:
		var buf [8]byte
		n := copy(buf[:], b)
		return int64(binary.LittleEndian.Uint64(buf[:])), b[n:]
	case 1:
		if len(b) == 0 {
			return int64(0), b
		}
		return int64(int8(b[0])), b[1:]
	case 2:
		if len(b) == 0 {
			return "", b
		}
		n := min(int(b[0]), len(b)-1)
		return string(b[1 : 1+n]), b[1+n:]
	case 3:
		if len(b) == 0 || depth > 3 {
			return []any{}, b
		}
		n := int(b[0] % 32)
		b = b[1:]
		list := make([]any, 0, n)
		for i := 0; i < n && len(b) > 0; i++ {
			var v any
			v, b = decodeReply(b, depth+1)
			list = append(list, v)
		}
		return list, b
	case 4:
		return nil, b
	default:
		return 1.5, b
	}
}

// encodeInts is the fuzz encoding of a list of small or large integers.
func encodeInts(vs ...int64) []byte {
	out := []byte{0, 3, byte(len(vs))} // no error, list
	for _, v := range vs {
		if v >= -128 && v <= 127 {
			out = append(out, 1, byte(int8(v)))
		} else {
			out = append(out, 0)
			out = binary.LittleEndian.AppendUint64(out, uint64(v))
		}
	}
	return out
}

// replyFrom decodes the whole input: its first byte chooses an error
// (redis.Nil, a script error) or none, the rest is the reply.
func replyFrom(data []byte) (any, error) {
	if len(data) == 0 {
		return nil, nil
	}
	var err error
	switch data[0] % 4 {
	case 1:
		err = redis.Nil
	case 2:
		err = errors.New("ERR Error running script")
	}
	v, _ := decodeReply(data[1:], 0)
	return v, err
}

func FuzzParsers(f *testing.F) {
	now := int64(1_790_000_000_000_000)
	for _, seed := range [][]byte{
		encodeInts(0, 0, 0, 1, 7, now),                      // enqueue: granted
		encodeInts(2, 12_000, 3, 1, 8, 0),                   // enqueue: queued
		encodeInts(1, 500, 0, 1, 9, now, 2, 1, 1, 0, 10, 0), // enqueue of two
		encodeInts(1, 0, 4, 2),                              // step: running
		encodeInts(-1, 0, 0, 0),                             // step: fenced
		encodeInts(1, -300, 0, 0, now),                      // poll: slot, late
		encodeInts(2, 40_000, 5, -2, 0),                     // poll: waiting, no lock
		{0, 1, 0},                                           // cancel: removed
		{0, 1, 2},                                           // cancel: unknown
		encodeInts(9, 0, 0, 0, 0, 0),                        // out of range kind
		encodeInts(-1<<63, 1<<63-1, 0, 0, 0),                // extremes
		{0, 3, 3, 1, 1, 2, 1, 'x', 4},                       // a string and a nil in a list
		{0, 3, 1, 3, 1, 1, 5},                               // nested list
		{0, 5},                                              // a float
		{1},                                                 // redis.Nil
		{2, 3, 0},                                           // an error with a reply
		{},
	} {
		f.Add(seed, uint8(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		reply, err := replyFrom(data)

		if v, perr := scriptreply.Ints(reply, err); perr == nil {
			list, ok := reply.([]any)
			if !ok || len(v) != len(list) || err != nil {
				t.Fatalf("ints accepted %#v (err %v) as %v", reply, err, v)
			}
		} else if err != nil && !errors.Is(perr, err) {
			t.Fatalf("ints lost the Redis error %v: %v", err, perr)
		}

		callers := int(n%4) + 1 // EnqueueBatch always asks for len(ids) ≥ 1
		ids := make([]string, callers)
		if out, perr := parseEnqueue(ids, make([]string, callers), reply, err); perr == nil {
			if len(out) != callers {
				t.Fatalf("parseEnqueue(%d) returned %d replies", callers, len(out))
			}
			for _, e := range out {
				if e.Err != nil && (e.Entry != "" || (e.Err != queueio.ErrQueueFull && e.Err != queueio.ErrWaitTooLong)) {
					t.Fatalf("parseEnqueue gave a refusal of no known kind, or a queued refusal: %+v", e)
				}
			}
		}
		if p, perr := parsePoll(reply, err); perr == nil {
			if n := btoi(p.Found) + btoi(p.Stale) + btoi(p.Lost); n > 1 {
				t.Fatalf("parsePoll gave %d outcomes at once: %+v", n, p)
			}
		}
		if cs, perr := parseCancel(callers, reply, err); perr == nil {
			for _, c := range cs {
				if c < removed || c > notFound {
					t.Fatalf("parseCancel accepted %d", c)
				}
			}
		}
	})
}

// TestParseDurationOverflow: a reply's µs or ms count that does not fit a
// time.Duration must be refused or clamped, never wrapped to the opposite
// sign. Found by FuzzParsers: a lock TTL beyond 292 years of ms wrapped
// negative (a waiting caller would take a held lock for none), and an
// estimate that large is reachable (RefillFrequency may be 100 years, so
// the third queued caller's estimate is 300 years).
func TestParseDurationOverflow(t *testing.T) {
	for _, c := range []struct {
		name  string
		parse func() (time.Duration, error)
		want  func(time.Duration) bool
	}{
		{"poll lock TTL", func() (time.Duration, error) {
			r, err := parsePoll([]any{int64(2), int64(0), int64(1), math.MaxInt64/int64(time.Millisecond) + 1, int64(0)}, nil)
			return r.LockTTL, err
		}, func(d time.Duration) bool { return d > 0 }},
		{"poll delay", func() (time.Duration, error) {
			r, err := parsePoll([]any{int64(2), math.MaxInt64/int64(time.Microsecond) + 1, int64(3), int64(100), int64(0)}, nil)
			return r.Delay, err
		}, func(d time.Duration) bool { return d > 0 }},
		{"enqueue delay", func() (time.Duration, error) {
			r, err := parseEnqueue([]string{"a"}, []string{""}, []any{int64(1_790_000_000_000_000), int64(1), int64(4), int64(2), int64(9_467_280_000_000_000), int64(3)}, nil)
			if err != nil {
				return 0, err
			}
			return r[0].Delay, nil
		}, func(d time.Duration) bool { return d > 0 }},
	} {
		d, err := c.parse()
		if err == nil && !c.want(d) {
			t.Errorf("%s: accepted and wrapped to %v, want an error or a clamped positive duration", c.name, d)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
