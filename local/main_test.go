package local

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// enterer is what the arrival scripts drive: Rate, Spacer and Noop.
type enterer interface {
	Enter(ctx context.Context) error
}

// costEnterer is an enterer that takes costs: Rate and Noop.
type costEnterer interface {
	enterer
	EnterN(ctx context.Context, n int) error
}

// arrival is one scripted caller: it calls Enter at offset at, or EnterN
// when cost is not zero, and gives up at offset cancelAt unless that is
// zero.
type arrival struct {
	at, cancelAt time.Duration
	cost         int
}

// enter calls Enter, or EnterN when a has a cost.
func (a arrival) enter(ctx context.Context, lim enterer) error {
	if a.cost != 0 {
		return lim.(costEnterer).EnterN(ctx, a.cost)
	}
	return lim.Enter(ctx)
}

// outcome is when a scripted call returned, and what.
type outcome struct {
	at  time.Duration
	err error
}

// play runs the script inside a synctest bubble. Arrivals must be sorted;
// callers arriving at the same instant call Enter in script order, because
// each one is blocked (or done) before the next starts.
func play(t *testing.T, lim enterer, script []arrival) []outcome {
	t.Helper()
	t0 := time.Now()
	out := make([]outcome, len(script))
	var wg sync.WaitGroup
	for i, a := range script {
		time.Sleep(time.Until(t0.Add(a.at)))
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if a.cancelAt > 0 {
			ctx, cancel = context.WithDeadline(ctx, t0.Add(a.cancelAt))
		}
		wg.Go(func() {
			defer cancel()
			err := a.enter(ctx, lim)
			out[i] = outcome{time.Since(t0), err}
		})
		synctest.Wait()
	}
	wg.Wait()
	return out
}

// checkOutcomes compares outcomes to the wanted ones, times rounded to the
// microsecond (Rate's rounding guard adds nanoseconds to each interval).
func checkOutcomes(t *testing.T, got, want []outcome) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d outcomes, want %d", len(got), len(want))
	}
	for i := range want {
		g := got[i]
		if g.at.Round(time.Microsecond) != want[i].at || !matches(g.err, want[i].err) {
			t.Errorf("caller %d: returned at %v with %v, want at %v with %v", i, g.at, g.err, want[i].at, want[i].err)
		}
	}
}

func matches(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}

// maxInWindow returns the most starts found in any half-open window of
// length w.
func maxInWindow(starts []time.Time, w time.Duration) int {
	s := append([]time.Time(nil), starts...)
	sort.Slice(s, func(i, j int) bool { return s[i].Before(s[j]) })
	most, j := 0, 0
	for i := range s {
		for j < len(s) && s[j].Before(s[i].Add(w)) {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// costCase is a cost that EnterN or AcquireN must answer at once.
type costCase struct {
	name    string
	ctx     context.Context
	n       int
	wantErr error  // nil: want nil
	bad     bool   // want an error matching none of the sentinels
	words   string // the error names these
}

// checkCostAnswer judges the answer err of call (an EnterN or AcquireN
// that must answer at once): bad wants an error of its own (a negative
// cost), not a refusal or a config error; otherwise err must match
// wantErr; a cost that can never be granted must match
// sluice.ErrCostExceedsCapacity and not sluice.ErrLimited; and the error
// must say words.
func checkCostAnswer(t *testing.T, call string, err error, bad bool, wantErr error, words string) {
	t.Helper()
	switch {
	case bad:
		if err == nil || errors.Is(err, sluice.ErrLimited) || errors.Is(err, sluice.ErrCostExceedsCapacity) || errors.Is(err, sluice.ErrConfig) {
			t.Errorf("%s = %v, want an error of its own", call, err)
		}
	case !matches(err, wantErr):
		t.Errorf("%s = %v, want %v", call, err, wantErr)
	}
	if errors.Is(wantErr, sluice.ErrCostExceedsCapacity) &&
		(!errors.Is(err, sluice.ErrCostExceedsCapacity) || errors.Is(err, sluice.ErrLimited)) {
		t.Errorf("%s = %v: want it to match sluice.ErrCostExceedsCapacity and not sluice.ErrLimited", call, err)
	}
	if err != nil && !strings.Contains(err.Error(), words) {
		t.Errorf("%s = %q, want it to say %q", call, err, words)
	}
}
