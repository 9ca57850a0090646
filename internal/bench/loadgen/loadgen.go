// Package loadgen drives callers through a bucket and records every grant,
// in one process or in worker processes that re-exec the running binary.
// Tests and cmd/bench share it, so both judge the same records with the
// same checker (internal/testing/guarantee).
package loadgen

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
)

// Grant is the record of one Enter.
type Grant struct {
	Proc       int    `json:"p"`
	Caller     int    `json:"c"`
	Ticket     int64  `json:"t"`
	Start      int64  `json:"s"` // unix ns when Enter was called
	End        int64  `json:"e"` // unix ns when Enter returned
	Position   int    `json:"pos,omitempty"`
	Polls      int    `json:"po,omitempty"`
	RoundTrips int    `json:"rt"`
	Late       int64  `json:"l,omitempty"` // ns
	Reentries  int    `json:"re,omitempty"`
	Retimes    int    `json:"rtm,omitempty"` // bucket.Report.Retimes
	Refunds    int    `json:"rf,omitempty"`  // enterdetail.Detail.Refunds
	Claims     int    `json:"cl,omitempty"`  // enterdetail.Detail.Claims
	Slot       int64  `json:"sl,omitempty"`  // unix µs of the slot on the Redis clock
	Margin     int64  `json:"mg,omitempty"`  // ns: enterdetail.Detail.Margin
	Err        string `json:"err,omitempty"`
	// Local: the local share admitted it (bucket.Report.Local).
	Local bool `json:"lo,omitempty"`
	// Seq numbers a caller's Enters from 1 when Spec.Announce is set
	// (0 otherwise), so that an outcome can be matched with its
	// announcement.
	Seq int `json:"n,omitempty"`
	// Cost is the caller's cost in Spec.CostUnit (0 without one).
	Cost int `json:"co,omitempty"`
	// Actual is the true cost a settled reservation was charged (Spec's
	// SettleMax); SettleSent and SettleDone (unix ns) bound when the
	// charge happened; SettleErr is its error.
	Actual     int    `json:"ac,omitempty"`
	SettleSent int64  `json:"ss,omitempty"`
	SettleDone int64  `json:"sd,omitempty"`
	SettleErr  string `json:"se,omitempty"`
	// Reserved marks an announcement (Begun) sent once a reservation was
	// granted, before it is settled (Spec.Announce with SettleMax).
	Reserved bool `json:"rs,omitempty"`
	// Begun marks an announcement (Spec.Announce): the caller is about to
	// call Enter; its outcome follows in a record with the same Caller and
	// Seq. Proc keeps announcements apart from outcomes (Proc.Pending).
	Begun bool `json:"b,omitempty"`
}

// OK reports whether the Enter succeeded.
func (g Grant) OK() bool { return g.Err == "" }

// Time is when Enter returned: the grant as the caller's work sees it.
func (g Grant) Time() time.Time { return time.Unix(0, g.End) }

// SlotTime is the slot on the Redis clock.
func (g Grant) SlotTime() time.Time { return time.UnixMicro(g.Slot) }

// Wait is how long Enter took.
func (g Grant) Wait() time.Duration { return time.Duration(g.End - g.Start) }

// Spec is the work of one process.
type Spec struct {
	Proc    int           `json:"proc"`
	Addr    string        `json:"addr"`
	Bucket  bucket.Config `json:"bucket"`
	Callers int           `json:"callers"` // goroutines
	Enters  int           `json:"enters"`  // Enters per goroutine; 0: until Until
	Until   time.Duration `json:"until"`   // stop starting Enters after this; 0: none
	Timeout time.Duration `json:"timeout"` // per Enter; 0: none
	// Stagger spreads the callers' first arrival over this long.
	Stagger time.Duration `json:"stagger"`
	// URL, when set, is a redis:// or rediss:// URL the worker connects
	// to instead of Addr (for a server that needs TLS or a password).
	URL string `json:"url,omitempty"`
	// StartAt, when set, is the instant (unix ns) a worker's callers
	// begin, so that several workers start together; Until counts from
	// it. Run itself ignores it.
	StartAt int64 `json:"start_at,omitempty"`
	// Announce makes every caller send a record with Begun set before
	// each Enter, so that an Enter that never returns can be found
	// (Proc.Pending).
	Announce bool `json:"announce,omitempty"`
	// Heartbeat, when set, makes a worker report its scheduler's step
	// count this often, so that the parent can tell which process runs
	// the scheduler (Proc.LastStep).
	Heartbeat time.Duration `json:"heartbeat,omitempty"`
	// Backoff, when set, is how long a caller waits after a failed Enter
	// before the next, as a real client would, rather than spinning
	// while Redis is down.
	Backoff time.Duration `json:"backoff,omitempty"`
	// QuietRedis silences go-redis's own log lines in a worker (a dead
	// server makes its pool log every failed dial).
	QuietRedis bool `json:"quiet_redis,omitempty"`
	// CostUnit, when set, makes every Enter an EnterCost of one call and
	// a cost in this unit drawn uniformly from CostMin to CostMax (seeded
	// by Proc and caller, so a run can be replayed); the grant records it.
	CostUnit string `json:"cost_unit,omitempty"`
	CostMin  int    `json:"cost_min,omitempty"`
	CostMax  int    `json:"cost_max,omitempty"`
	// Lane, when set, puts every Enter in this lane (bucket.WithLane).
	Lane string `json:"lane,omitempty"`
	// SettleMin and SettleMax, when SettleMax is set, make every caller
	// Reserve its cost as an estimate and then Settle its cost in
	// CostUnit at a true cost drawn uniformly from SettleMin to SettleMax
	// percent of the estimate (above 100: a debt), after holding the
	// reservation for Work; the grant records both.
	SettleMin int           `json:"settle_min,omitempty"`
	SettleMax int           `json:"settle_max,omitempty"`
	Work      time.Duration `json:"work,omitempty"`
	// Hog, when set, makes a worker run this many goroutines that keep
	// the CPU busy (see Hog) while its callers enter: a process starved
	// of CPU by its own other work. Run itself ignores it.
	Hog int `json:"hog,omitempty"`
}

// Run runs spec's callers through b and sends every grant to out. It
// returns when all callers are done or ctx ends.
func Run(ctx context.Context, b *bucket.Bucket, spec Spec, out func(Grant)) {
	var wg sync.WaitGroup
	begin := time.Now()
	for c := 0; c < spec.Callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if spec.Stagger > 0 && spec.Callers > 1 {
				d := spec.Stagger * time.Duration(c) / time.Duration(spec.Callers-1)
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
			rng := rand.New(rand.NewPCG(uint64(spec.Proc), uint64(c)))
			for n := 0; spec.Enters == 0 || n < spec.Enters; n++ {
				if ctx.Err() != nil || (spec.Until > 0 && time.Since(begin) > spec.Until) {
					return
				}
				ectx, cancel := ctx, context.CancelFunc(func() {})
				if spec.Timeout > 0 {
					ectx, cancel = context.WithTimeout(ctx, spec.Timeout)
				}
				seq := 0
				if spec.Announce {
					seq = n + 1
					out(Grant{Proc: spec.Proc, Caller: c, Seq: seq, Start: time.Now().UnixNano(), Begun: true})
				}
				var costs []bucket.Cost
				cost := 0
				if spec.CostUnit != "" {
					cost = spec.CostMin + rng.IntN(max(spec.CostMax-spec.CostMin, 0)+1)
					costs = []bucket.Cost{{"": 1, spec.CostUnit: cost}}
				}
				start := time.Now()
				var rep bucket.Report
				var res *bucket.Reservation
				var err error
				var d enterdetail.Detail
				ectx = enterdetail.With(ectx, &d)
				if spec.Lane != "" {
					ectx = bucket.WithLane(ectx, spec.Lane)
				}
				if spec.SettleMax > 0 && costs != nil {
					if res, err = b.Reserve(ectx, costs[0]); err == nil {
						rep = res.Report()
					}
				} else {
					rep, err = b.EnterReport(ectx, costs...)
				}
				end := time.Now()
				cancel()
				g := Grant{Proc: spec.Proc, Caller: c, Ticket: rep.Ticket, Start: start.UnixNano(), End: end.UnixNano(),
					Position: rep.Position, Polls: d.Polls, RoundTrips: d.RoundTrips, Late: int64(rep.Late), Reentries: rep.Reentries, Retimes: rep.Retimes, Refunds: d.Refunds, Claims: d.Claims, Margin: int64(d.Margin), Local: rep.Local, Seq: seq, Cost: cost}
				if !d.Slot.IsZero() {
					g.Slot = d.Slot.UnixMicro()
				}
				if err != nil {
					g.Err = err.Error()
				}
				if res != nil {
					if spec.Announce {
						out(Grant{Proc: spec.Proc, Caller: c, Seq: seq, Start: g.Start, Cost: cost, Begun: true, Reserved: true})
					}
					settle(ctx, res, spec, rng, &g)
				}
				out(g)
				if err != nil && ctx.Err() != nil {
					return
				}
				if err != nil && spec.Backoff > 0 {
					t := time.NewTimer(spec.Backoff)
					select {
					case <-t.C:
					case <-ctx.Done():
					}
					t.Stop()
				}
			}
		}()
	}
	wg.Wait()
}

// settle holds res for spec.Work and settles it at a true cost drawn
// from spec's range, recording it in g.
func settle(ctx context.Context, res *bucket.Reservation, spec Spec, rng *rand.Rand, g *Grant) {
	if spec.Work > 0 {
		t := time.NewTimer(spec.Work)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	pct := spec.SettleMin + rng.IntN(max(spec.SettleMax-spec.SettleMin, 0)+1)
	g.Actual = g.Cost * pct / 100
	g.SettleSent = time.Now().UnixNano()
	err := res.Settle(context.WithoutCancel(ctx), bucket.Cost{spec.CostUnit: g.Actual})
	g.SettleDone = time.Now().UnixNano()
	if err != nil {
		g.SettleErr = err.Error()
	}
}

// EnvSpec is the environment variable that makes a binary a worker.
const EnvSpec = "SLUICE_LOADGEN_SPEC"

// MaybeWorker turns this process into a worker when EnvSpec is set: it runs
// the spec against Redis, writes one JSON line per grant to stdout, and
// exits. Call it first in TestMain or main. A worker stops at SIGTERM or
// when its stdin closes (the parent died).
func MaybeWorker() {
	raw := os.Getenv(EnvSpec)
	if raw == "" {
		return
	}
	if err := worker(raw); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func worker(raw string) error {
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return err
	}
	if spec.QuietRedis {
		redis.SetLogger(quietLogger{})
	}
	opt, err := RedisOptions(spec.Addr, spec.URL)
	if err != nil {
		return err
	}
	opt.ContextTimeoutEnabled, opt.PoolSize, opt.MaxRetries = true, spec.Callers+10, -1
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var counter RoundTripCounter
	rdb.AddHook(&counter)
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return err
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the parent closes our stdin to stop us, or dies
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	w := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	fmt.Fprintln(w, `{"ready":true}`)
	w.Flush()
	if spec.StartAt > 0 {
		t := time.NewTimer(time.Until(time.Unix(0, spec.StartAt)))
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	stopHog := Hog(spec.Hog)
	var beat sync.WaitGroup
	beatDone := make(chan struct{})
	if spec.Heartbeat > 0 {
		beat.Go(func() {
			t := time.NewTicker(spec.Heartbeat)
			defer t.Stop()
			for {
				select {
				case <-t.C:
				case <-beatDone:
					return
				}
				line, _ := json.Marshal(heartbeatLine{Heartbeat: heartbeat{Steps: b.Stats().Steps}})
				mu.Lock()
				w.Write(append(line, '\n'))
				w.Flush()
				mu.Unlock()
			}
		})
	}
	Run(ctx, b, spec, func(g Grant) {
		line, _ := json.Marshal(g)
		mu.Lock()
		w.Write(append(line, '\n'))
		w.Flush()
		mu.Unlock()
	})
	stopHog()
	close(beatDone)
	beat.Wait()
	// Close first, so that the lock's release is counted too.
	b.Close()
	st := b.Stats()
	line, err := json.Marshal(statsLine{Stats: WorkerStats{
		RoundTrips:      counter.RoundTrips(),
		SetupRoundTrips: counter.Setup(),
		SchedulerSteps:  st.Steps,
		SchedulerFenced: st.Fenced,
		SchedulerErrors: st.Errors,
	}})
	if err != nil {
		return err
	}
	w.Write(append(line, '\n'))
	return w.Flush()
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// WorkerStats are a worker's totals, reported once as it exits.
type WorkerStats struct {
	// RoundTrips counts every command and pipeline the worker's client
	// sent to Redis: callers' scripts, the scheduler's steps, its lock
	// requests and the script loads at start. SetupRoundTrips counts the
	// connection handshakes (see RoundTripCounter).
	RoundTrips      int64 `json:"rt"`
	SetupRoundTrips int64 `json:"setup_rt"`
	SchedulerSteps  int64 `json:"steps"`
	SchedulerFenced int64 `json:"fenced"`
	SchedulerErrors int64 `json:"sched_errs"`
}

// statsLine is the worker's last line; the key "stats" tells it apart
// from a grant.
type statsLine struct {
	Stats WorkerStats `json:"stats"`
}

const statsPrefix = `{"stats":`

// heartbeatLine is a worker's periodic report (Spec.Heartbeat).
type heartbeatLine struct {
	Heartbeat heartbeat `json:"hb"`
}

type heartbeat struct {
	Steps int64 `json:"steps"`
}

const heartbeatPrefix = `{"hb":`

// RoundTripCounter is a go-redis hook (add it with AddHook) that counts
// round trips: each command and each pipeline or transaction counts one,
// whatever it carries (a script's EVALSHA and its EVAL fallback are two).
// The handshake go-redis makes on each new connection (HELLO, CLIENT,
// AUTH, SELECT) is counted apart, as Setup: it is paid per connection,
// not per call. The zero value is ready; it is safe for concurrent use.
type RoundTripCounter struct{ n, setup atomic.Int64 }

// RoundTrips is the count so far, connection handshakes left out.
func (c *RoundTripCounter) RoundTrips() int64 { return c.n.Load() }

// Setup is the round trips of connection handshakes so far.
func (c *RoundTripCounter) Setup() int64 { return c.setup.Load() }

// DialHook lets dials through uncounted.
func (c *RoundTripCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook counts one command.
func (c *RoundTripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts one pipeline.
func (c *RoundTripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 {
			c.count(cmds[0])
		}
		return next(ctx, cmds)
	}
}

func (c *RoundTripCounter) count(cmd redis.Cmder) {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client", "auth", "select":
		c.setup.Add(1)
	default:
		c.n.Add(1)
	}
}

// Proc is a running worker process.
type Proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	ready chan struct{}
	err   error

	mu       sync.Mutex
	grants   []Grant
	n        int
	stats    WorkerStats
	hasStats bool
	pending  map[[2]int]Grant // announcements without an outcome yet
	steps    int64            // the last heartbeat's step count
	stepAt   time.Time        // when a heartbeat last showed the count grow
}

// Start starts a worker process running spec: the current binary re-executed
// with args (for a test binary, "-test.run=^$" keeps it from running tests).
func Start(spec Spec, args ...string) (*Proc, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), EnvSpec+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, stdin: stdin, done: make(chan struct{}), ready: make(chan struct{}), pending: map[[2]int]Grant{}}
	go p.read(stdout)
	return p, nil
}

func (p *Proc) read(r io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	readyOnce := sync.OnceFunc(func() { close(p.ready) })
	defer readyOnce()
	for sc.Scan() {
		line := sc.Bytes()
		if string(line) == `{"ready":true}` {
			readyOnce()
			continue
		}
		if bytes.HasPrefix(line, []byte(statsPrefix)) {
			var st statsLine
			if err := json.Unmarshal(line, &st); err != nil {
				p.err = fmt.Errorf("worker output %q: %w", line, err)
				continue
			}
			p.mu.Lock()
			p.stats, p.hasStats = st.Stats, true
			p.mu.Unlock()
			continue
		}
		if bytes.HasPrefix(line, []byte(heartbeatPrefix)) {
			var hb heartbeatLine
			if err := json.Unmarshal(line, &hb); err != nil {
				p.err = fmt.Errorf("worker output %q: %w", line, err)
				continue
			}
			p.mu.Lock()
			if hb.Heartbeat.Steps > p.steps {
				p.steps, p.stepAt = hb.Heartbeat.Steps, time.Now()
			}
			p.mu.Unlock()
			continue
		}
		var g Grant
		if err := json.Unmarshal(line, &g); err != nil {
			p.err = fmt.Errorf("worker output %q: %w", line, err)
			continue
		}
		p.mu.Lock()
		switch key := [2]int{g.Caller, g.Seq}; {
		case g.Begun:
			p.pending[key] = g
		default:
			delete(p.pending, key)
			p.grants = append(p.grants, g)
			p.n++
		}
		p.mu.Unlock()
	}
	p.err = errors.Join(p.err, p.cmd.Wait())
}

// Pid is the worker's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Ready is closed once the worker has made its bucket (or exited).
func (p *Proc) Ready() <-chan struct{} { return p.ready }

// Done is closed when the worker has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Count is the number of grant records received so far.
func (p *Proc) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Stop asks the worker to stop starting Enters (it closes its stdin).
func (p *Proc) Stop() { p.stdin.Close() }

// Signal sends sig to the worker process (SIGKILL, SIGSTOP, SIGCONT for
// fault tests).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Grants returns the outcomes received so far, without waiting.
func (p *Proc) Grants() []Grant {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.grants)
}

// Pending returns the announcements (Spec.Announce) whose outcome has not
// been received: Enters in flight, or, once the worker is gone or stuck,
// Enters that never returned.
func (p *Proc) Pending() []Grant {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Grant, 0, len(p.pending))
	for _, g := range p.pending {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grant) int { return cmp.Compare(a.Start, b.Start) })
	return out
}

// LastStep is when a heartbeat (Spec.Heartbeat) last showed the worker's
// scheduler step count grow (zero if never): the worker that stepped most
// recently is the likeliest holder of the scheduler lock.
func (p *Proc) LastStep() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stepAt
}

// Wait waits for the worker to exit and returns its grants.
func (p *Proc) Wait() ([]Grant, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.grants, p.err
}

// Stats waits for the worker to exit and returns its totals; ok is false
// when the worker died before reporting them.
func (p *Proc) Stats() (st WorkerStats, ok bool) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats, p.hasStats
}

// RedisOptions are the options of a worker process's client: the server
// at addr, or url when it is set (a redis:// or rediss:// URL, for a
// server that needs TLS or a password).
func RedisOptions(addr, url string) (*redis.Options, error) {
	if url != "" {
		return redis.ParseURL(url)
	}
	return &redis.Options{Addr: addr}, nil
}
