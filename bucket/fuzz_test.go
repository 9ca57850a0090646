package bucket_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

var fuzzSeq atomic.Int64

// FuzzConfig: New with any Config never panics; it refuses with ErrConfig
// or returns a bucket whose filled-in Config keeps the documented bounds;
// and a bucket New accepts works: four concurrent Enters on a 50 ms
// deadline are each granted, refused (ErrLimited) or cut by the deadline,
// never a Redis or script error. It runs against a real redis-server (one per fuzz process).
// go test -fuzz=FuzzConfig ./bucket explores beyond the seeds.
func FuzzConfig(f *testing.F) {
	srv := redistest.New(f)
	rdb := srv.Client()
	f.Cleanup(func() { rdb.Close() })
	y100 := int64(100 * 365 * 24 * time.Hour)
	for _, c := range []struct {
		name                     string
		capacity, amount         int
		freq                     int64
		prefix                   string
		lockTTL, lookahead, late int64
		maxQueue                 int
		maxWait                  int64
	}{
		{"ok", 10, 1, int64(time.Second), "", 0, 0, 0, 0, 0},
		{"fast", 1, 1, int64(time.Microsecond), "", 0, 0, 0, 0, 0},
		{"slow", 1, 1, y100, "", 0, 0, 0, 0, 0},
		{"huge", 1 << 40, 1 << 40, y100, "", 0, 0, 0, 0, 0},
		{"huge, 1 a century", 1 << 40, 1, y100, "", 0, 0, 0, 0, 0},
		{"bounds", 2, 2, int64(time.Millisecond), "p:q", int64(10 * time.Millisecond), int64(5 * time.Millisecond), -1, 1, 1},
		{"{}", 3, 1, int64(time.Millisecond), "a{", 0, 0, 0, 0, 0},
		{"", 1, 1, 1, "", 0, 0, 0, 0, 0},
		{"neg", -1, -1, -1, "", -1, -1, -1, -1, -1},
		{"too much", 1<<40 + 1, 1, y100 + 1, "", 1 << 62, 1 << 62, 1 << 62, 1 << 62, 1 << 62},
		{"ns", 5, 1, int64(time.Millisecond) + 1, "", 0, 0, 0, 0, 0},
	} {
		f.Add(c.name, c.capacity, c.amount, c.freq, c.prefix, c.lockTTL, c.lookahead, c.late, c.maxQueue, c.maxWait)
	}
	f.Fuzz(func(t *testing.T, name string, capacity, amount int, freq int64, prefix string,
		lockTTL, lookahead, late int64, maxQueue int, maxWait int64) {
		if name != "" { // the same name with another config is a misuse New cannot see
			name += "#" + strconv.FormatInt(fuzzSeq.Add(1), 10)
		}
		cfg := bucket.Config{Name: name, Capacity: capacity, RefillAmount: amount, RefillFrequency: time.Duration(freq),
			KeyPrefix: prefix, LockTTL: time.Duration(lockTTL), Lookahead: time.Duration(lookahead),
			MaxLateness: time.Duration(late), MaxQueue: maxQueue, MaxWait: time.Duration(maxWait)}
		b, err := bucket.New(rdb, cfg)
		if err != nil {
			if !errors.Is(err, sluice.ErrConfig) {
				t.Fatalf("New(%+v): %v, want ErrConfig or a bucket", cfg, err)
			}
			return
		}
		defer b.Close()
		c := b.Config()
		switch {
		case c.Capacity < 1, c.RefillAmount < 1, c.RefillAmount > c.Capacity:
			t.Fatalf("accepted counts %+v", c)
		case c.RefillFrequency < time.Microsecond, c.RefillFrequency%time.Microsecond != 0:
			t.Fatalf("accepted RefillFrequency %v", c.RefillFrequency)
		case c.LockTTL < 10*time.Millisecond, c.Lookahead < time.Millisecond, c.Lookahead > c.LockTTL/2:
			t.Fatalf("accepted LockTTL %v, Lookahead %v", c.LockTTL, c.Lookahead)
		case c.MaxLateness == 0, c.KeyPrefix == "", c.MaxQueue < 0, c.MaxWait < 0:
			t.Fatalf("defaults not filled in: %+v", c)
		case c.MaxLateness > 0 && c.MaxLateness < time.Millisecond:
			t.Fatalf("accepted MaxLateness %v, under which every caller is late", c.MaxLateness)
		}
		// Four callers at once: the first takes a token, the others may
		// queue behind it, with estimates of up to three refills.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		errs := make(chan error, 4)
		for range 4 {
			go func() { errs <- b.Enter(ctx) }()
		}
		for range 4 {
			err := <-errs
			if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sluice.ErrLimited) {
				continue
			}
			// A socket deadline (the ctx's) can fire before ctx.Err() is
			// set: TestDeadlineErrorMatchesCtx covers that bug; here an
			// error at or after the deadline, by the clock, is the deadline's.
			if dl, _ := ctx.Deadline(); time.Now().Before(dl) {
				t.Errorf("Enter on an accepted config %+v: %v", c, err)
			}
		}
	})
}
