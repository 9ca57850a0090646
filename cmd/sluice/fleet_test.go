package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// fleetGrant is one grant of the mixed fleet, on the Redis clock.
type fleetGrant struct {
	slot   time.Time
	ticket int64
	python bool
	// retimed: the caller came later than MaxLateness for its slot and
	// took the next one, ahead of the callers queued, by design.
	retimed bool
	// claimed: the caller took a slot another caller had not come for
	// (enterdetail.Detail.Claims).
	claimed bool
}

// pythonWorker runs tasks asyncio tasks, each entering bucket name through
// the Python client until the run's end, and prints how many were granted.
const pythonWorker = `
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
import sluice
url, name, tasks, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
async def task(b, end):
    n = 0
    while time.monotonic() < end:
        await b.enter()
        n += 1
    return n
async def main():
    b = sluice.Bucket(name, url=url)
    end = time.monotonic() + seconds
    print(sum(await asyncio.gather(*(task(b, end) for _ in range(tasks)))))
asyncio.run(main())
`

// TestMixedFleet: Go callers of the library and Python callers through
// the sidecar share one saturated bucket; over every grant of both, the
// slots keep the limit and follow the arrival order.
func TestMixedFleet(t *testing.T) {
	// SLUICE_PYTHON names another interpreter (scripts/test passes it
	// on): the client supports Python 3.9 and later.
	python, err := exec.LookPath("python3")
	if want := os.Getenv("SLUICE_PYTHON"); want != "" {
		if python, err = exec.LookPath(want); err != nil {
			t.Fatalf("SLUICE_PYTHON=%s: %v", want, err)
		}
	} else if err != nil {
		t.Skip("SKIPPED LOUDLY: python3 is not on PATH, so the mixed fleet (Go and Python callers) is not tested")
	}
	// go test runs in the package's directory (-trimpath leaves no
	// absolute path in the binary to find it from).
	clientDir, err := filepath.Abs(filepath.Join("..", "..", "clients", "python"))
	if err != nil {
		t.Fatal(err)
	}
	_, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(200, time.Second, 10)}}
	p := cfg.Policies[0]
	limit := guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
	lib := newBucket(t, rdb, cfg)

	var mu sync.Mutex
	var grants []fleetGrant
	s, err := newSidecar(rdb, sidecarOptions{
		prefix: "sluice", addr: "test", maxWaiting: 1000, lease: time.Second,
		config: serveConfig{Buckets: map[string]bucketConfig{cfg.Name: {policies: cfg.Policies}}},
		granted: func(name string, d enterdetail.Detail, rep bucket.Report, c bucket.Cost) {
			mu.Lock()
			grants = append(grants, fleetGrant{slot: d.Slot, ticket: rep.Ticket, python: true, retimed: rep.Retimes > 0, claimed: d.Claims > 0})
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	const run = 1500 * time.Millisecond
	const pythonProcs, pythonTasks, goCallers = 2, 8, 16
	var wg sync.WaitGroup
	outs := make([]string, pythonProcs)
	errs := make([]error, pythonProcs)
	for i := range pythonProcs {
		wg.Go(func() {
			cmd := exec.Command(python, "-c", pythonWorker, clientDir, "http://"+ln.Addr().String(), cfg.Name, strconv.Itoa(pythonTasks), strconv.FormatFloat(run.Seconds(), 'f', 3, 64))
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		})
	}
	end := time.Now().Add(run)
	var libErrs []error
	for range goCallers {
		wg.Go(func() {
			for time.Now().Before(end) {
				var d enterdetail.Detail
				rep, err := lib.EnterReport(enterdetail.With(context.Background(), &d))
				mu.Lock()
				if err != nil {
					libErrs = append(libErrs, err)
				} else {
					grants = append(grants, fleetGrant{slot: d.Slot, ticket: rep.Ticket, retimed: rep.Retimes > 0, claimed: d.Claims > 0})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := range pythonProcs {
		if errs[i] != nil {
			t.Fatalf("Python worker %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	if len(libErrs) > 0 {
		t.Fatalf("%d Go callers failed, first: %v", len(libErrs), libErrs[0])
	}

	var slots []time.Time
	pyGrants, pyCounted := 0, 0
	for _, g := range grants {
		if g.slot.IsZero() {
			t.Fatalf("a grant without a slot (python %v, ticket %d)", g.python, g.ticket)
		}
		slots = append(slots, g.slot)
		if g.python {
			pyGrants++
		}
	}
	for _, o := range outs {
		n, err := strconv.Atoi(strings.TrimSpace(o))
		if err != nil {
			t.Fatalf("Python worker said %q", o)
		}
		pyCounted += n
	}
	// The Python callers count their grants; the server saw each of them
	// (and none it did not answer).
	if pyCounted != pyGrants {
		t.Errorf("the Python workers counted %d grants, the server made %d", pyCounted, pyGrants)
	}
	if pyGrants == 0 || pyGrants == len(grants) {
		t.Fatalf("%d of %d grants went to Python callers: the fleet was not mixed", pyGrants, len(grants))
	}
	if r := guarantee.Check(slots, limit); !r.OK() {
		t.Errorf("the limit broken over the mixed fleet's %d grants: %v", len(grants), r)
	}

	// Arrival order: sorted by ticket, a queued caller whose slot is
	// before one of an earlier ticket overtook it. Retimed callers are
	// left out, as the bench leaves them out: a caller too late for its
	// slot takes the next one, ahead of those queued, by design; so are
	// callers that claimed a slot another had not come for (its caller
	// is retimed), ahead of those between, by design too.
	retimed := 0
	queued := slices.DeleteFunc(slices.Clone(grants), func(g fleetGrant) bool {
		if g.retimed || g.claimed {
			retimed++
		}
		return g.ticket == 0 || g.retimed || g.claimed
	})
	slices.SortFunc(queued, func(a, b fleetGrant) int { return int(a.ticket - b.ticket) })
	overtaken := 0
	var latest time.Time
	for _, g := range queued {
		if g.slot.Before(latest) {
			overtaken++
		}
		if g.slot.After(latest) {
			latest = g.slot
		}
	}
	first, last := slices.MinFunc(slots, time.Time.Compare), slices.MaxFunc(slots, time.Time.Compare)
	t.Logf("%d grants in %v of slots (%d through the sidecar to Python; the limit allows %d), %d retimed or claiming, %d of %d others out of arrival order",
		len(grants), last.Sub(first).Round(time.Millisecond), pyGrants, limit.Allowed(last.Sub(first)), retimed, overtaken, len(queued))
	if overtaken > 0 {
		t.Errorf("%d of %d queued callers (retimed ones left out) were given a slot before one that arrived earlier", overtaken, len(queued))
	}
}
