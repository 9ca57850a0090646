package bucket_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestStoppedProcessYields: two processes at saturation, the one that runs
// the scheduler stopped (SIGSTOP) three times for half its lock's TTL, as
// a pod at its CPU limit is: it keeps the lock and steps nothing. The
// running process's callers give the due slots themselves (the help), so
// that the running process is granted while the other is stopped; when
// it runs again its callers are all served; the checker judges every
// grant. (Claims, which this run seldom makes, are judged by
// scheduler/TestClaimSwapsSlots and TestGiveBacksKeepThePromise.)
func TestStoppedProcessYields(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg, _ := bucketConfig(t.Name(), 5, 1, 5*time.Millisecond)
	a, b, _ := schedulerScenario(t, srv, cfg, 3*time.Second)
	stop := cfg.LockTTL / 2
	type span struct{ from, to int64 }
	var stopped []span
	for range 3 {
		from := time.Now().UnixNano()
		if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(stop)
		stopped = append(stopped, span{from, time.Now().UnixNano()})
		if err := syscall.Kill(a.Pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(stop)
	}
	ga, gb := wait(t, a), wait(t, b)
	checkGrants(t, append(ga, gb...), cfg)
	claims, swapped, grantedWhileStopped := 0, 0, 0
	for _, g := range gb {
		claims += g.Claims
		for _, s := range stopped {
			if g.Err == "" && g.End >= s.from && g.End <= s.to {
				grantedWhileStopped++
			}
		}
	}
	for _, g := range ga {
		if g.Err != "" {
			t.Errorf("a caller of the stopped process failed: %s", g.Err)
			break
		}
		swapped += g.Retimes
	}
	// While A is stopped its lock stands and no step runs: without the
	// help B would be granted only the slots the last step gave (a
	// lookahead's worth, at most 4 at this rate, and a full bucket's 5)
	// until the lock expired (stop is half its TTL).
	if most := 3 * (cfg.Capacity + 4); grantedWhileStopped <= most {
		t.Errorf("B was granted %d in 3 × %v of A stopped, want more than the %d the last steps could have given: the help gave no slots", grantedWhileStopped, stop, most)
	}
	t.Logf("B granted %d while A was stopped (3 × %v), %d claims; A's callers retimed or passed over %d times", grantedWhileStopped, stop, claims, swapped)
}
