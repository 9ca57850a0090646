package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Sidecar is the saturated run with half the callers entering through
// `sluice serve` (Go HTTP clients, the way a worker in any language
// would) and half through the library, on one bucket: the limit used to
// the last token and never exceeded, arrival order kept across both
// kinds. Before it, the uncontended enter through the server against the
// library's, on a bucket that never runs out, in the same run.
type Sidecar struct {
	Callers     int           `json:"callers"` // half of them through the server
	Duration    time.Duration `json:"duration_ns"`
	Uncontended int           `json:"uncontended_enters"` // each way
	// Saturation judges every grant of both kinds together.
	Saturation
	LibraryGrants int  `json:"library_grants"`
	SidecarGrants int  `json:"sidecar_grants"`
	LibraryWait   Dist `json:"library_wait_queued_steady"`
	SidecarWait   Dist `json:"sidecar_wait_queued_steady"`
	// EnterLibrary and EnterSidecar are one uncontended enter's time,
	// from the call to its return (the library's Enter; the HTTP request
	// to the server, over a kept-alive loopback connection).
	EnterLibrary Dist `json:"uncontended_library"`
	EnterSidecar Dist `json:"uncontended_sidecar"`
	// HTTPAlone is a request the server answers without Redis (a 404):
	// the part of EnterSidecar that is the HTTP round trip.
	HTTPAlone Dist    `json:"http_alone"`
	Ratio     float64 `json:"uncontended_p50_ratio"` // EnterSidecar.P50 / EnterLibrary.P50

	bin string // --sidecar-bin
}

// The goals of the sidecar scenario.
const (
	sidecarUtilGoal      = 0.99
	sidecarOvertakenGoal = 0.005 // of the grants
	sidecarRatioGoal     = 2.0   // uncontended enter through the server, p50, over the library's
)

func (*Sidecar) about() about {
	return about{name: "sidecar", takes: "~6 s, and a build of cmd/sluice", all: true,
		what: "half the callers through `sluice serve` (HTTP), half through the library, on one bucket; and an uncontended enter each way"}
}

func (s *Sidecar) flags(fs *flag.FlagSet) {
	fs.IntVar(&s.Callers, "sidecar-callers", 100, "callers in total, half of them through the server")
	fs.DurationVar(&s.Duration, "sidecar-duration", 3*time.Second, "how long the callers keep entering")
	fs.IntVar(&s.Uncontended, "sidecar-uncontended", 1000, "uncontended enters each way, one at a time")
	fs.StringVar(&s.bin, "sidecar-bin", "", "the sluice command to run `serve` from (default: go build ./cmd/sluice into a temporary directory)")
}

func (s *Sidecar) check() error {
	switch {
	case s.Callers < 2:
		return fmt.Errorf("--sidecar-callers %d: want ≥ 2 (half through the server)", s.Callers)
	case s.Duration <= 0:
		return fmt.Errorf("--sidecar-duration %v: want > 0", s.Duration)
	case s.Uncontended < 1:
		return fmt.Errorf("--sidecar-uncontended %d: want ≥ 1", s.Uncontended)
	}
	return nil
}

func (s *Sidecar) run(ctx context.Context, e *env) error {
	dir, err := os.MkdirTemp("", "sluice-bench-sidecar-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := s.bin
	if bin == "" {
		e.logf("sidecar: building cmd/sluice...")
		if bin, err = buildSluice(ctx, dir); err != nil {
			return err
		}
	}
	cfg := e.limit
	cfg.Name = e.name
	free := bucket.Config{Name: e.name + "-uncontended", KeyPrefix: cfg.KeyPrefix, Capacity: 1 << 30, RefillAmount: 1 << 30, RefillFrequency: time.Second}
	srv, err := startSidecar(ctx, bin, dir, e.target, s.Callers, cfg, free)
	if err != nil {
		return err
	}
	defer srv.stop()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: s.Callers + 10}}
	defer hc.CloseIdleConnections()
	rdb := client(e.opt, s.Callers)
	defer rdb.Close()

	// Uncontended: one enter at a time each way, interleaved so that
	// both see the same machine.
	e.logf("sidecar: %d uncontended enters each way...", s.Uncontended)
	fb, err := bucket.New(rdb, free)
	if err != nil {
		return err
	}
	defer fb.Close()
	var lib, side, alone []time.Duration
	for i := range s.Uncontended + 20 { // the first 20 of each warm up
		t0 := time.Now()
		if err := fb.Enter(ctx); err != nil {
			return fmt.Errorf("sidecar: uncontended library enter: %w", err)
		}
		t1 := time.Now()
		if _, err := srv.enter(ctx, hc, free.Name); err != nil {
			return fmt.Errorf("sidecar: uncontended enter through the server: %w", err)
		}
		t2 := time.Now()
		if err := srv.notFound(ctx, hc); err != nil {
			return fmt.Errorf("sidecar: a request for no endpoint: %w", err)
		}
		t3 := time.Now()
		if i >= 20 {
			lib, side, alone = append(lib, t1.Sub(t0)), append(side, t2.Sub(t1)), append(alone, t3.Sub(t2))
		}
	}
	s.EnterLibrary, s.EnterSidecar, s.HTTPAlone = distOf(lib), distOf(side), distOf(alone)
	s.Ratio = float64(s.EnterSidecar.P50) / float64(max(s.EnterLibrary.P50, 1))

	// Saturated: both halves on one bucket.
	l := guarantee.Limit{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}
	rate := float64(l.RefillAmount) / l.RefillFrequency.Seconds()
	turn := time.Duration(float64(s.Callers) / rate * float64(time.Second))
	timeout := 30*time.Second + 4*turn
	libCallers, sideCallers := s.Callers/2, s.Callers-s.Callers/2
	e.logf("sidecar: %d callers through the library and %d through the server for %v at %.0f/s, burst %d...", libCallers, sideCallers, s.Duration, rate, l.Capacity)
	b, err := bucket.New(rdb, cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	var mu sync.Mutex
	var grants []loadgen.Grant
	record := func(g loadgen.Grant) {
		mu.Lock()
		grants = append(grants, g)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		loadgen.Run(ctx, b, loadgen.Spec{Proc: 0, Callers: libCallers, Until: s.Duration, Timeout: timeout}, record)
	})
	end := time.Now().Add(s.Duration)
	for i := range sideCallers {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				start := time.Now()
				rep, err := srv.enter(cctx, hc, cfg.Name)
				done := time.Now()
				cancel()
				g := loadgen.Grant{Proc: 1, Caller: i, Start: start.UnixNano(), End: done.UnixNano()}
				if err != nil {
					g.Err = err.Error()
				} else if d := rep.Detail; d == nil {
					g.Err = "the server gave no grant detail"
				} else {
					g.Ticket, g.Slot, g.Position, g.Polls = rep.Ticket, d.SlotUS, d.Position, d.Polls
					g.Retimes, g.Reentries, g.Late, g.Claims = d.Retimes, d.Reentries, d.LateNS, d.Claims
				}
				record(g)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	warmup := min(turn, s.Duration/2)
	maxLate := cmp.Or(cfg.MaxLateness, defaultMaxLateness)
	s.Saturation = analyse(grants, l, warmup, maxLate, 0)
	begin := int64(math.MaxInt64)
	for _, g := range grants {
		begin = min(begin, g.Start)
	}
	var waits [2][]time.Duration
	for _, g := range grants {
		if !g.OK() {
			continue
		}
		if g.Proc == 0 {
			s.LibraryGrants++
		} else {
			s.SidecarGrants++
		}
		if (g.Polls > 0 || g.Position > 0) && g.Start-begin >= int64(warmup) {
			waits[g.Proc] = append(waits[g.Proc], g.Wait())
		}
	}
	s.LibraryWait, s.SidecarWait = distOf(waits[0]), distOf(waits[1])
	return nil
}

// buildSluice builds cmd/sluice into dir.
func buildSluice(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "sluice")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "github.com/sluicehq/sluice/cmd/sluice")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sidecar: building cmd/sluice (run from the repository, or give --sidecar-bin): %v\n%s", err, out)
	}
	return bin, nil
}

// sidecarProc is a `sluice serve` process.
type sidecarProc struct {
	cmd  *exec.Cmd
	base string // http://host:port
	done chan error
}

// startSidecar runs `sluice serve` on a free port with buckets as its
// --config, and returns once it listens.
func startSidecar(ctx context.Context, bin, dir string, tg target, callers int, buckets ...bucket.Config) (*sidecarProc, error) {
	conf := map[string]map[string]any{"buckets": {}}
	for _, c := range buckets {
		conf["buckets"][c.Name] = map[string][]string{"policies": {
			fmt.Sprintf("capacity=%d,refill_amount=%d,refill_frequency=%v", c.Capacity, c.RefillAmount, c.RefillFrequency)}}
	}
	js, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "sluice.json")
	if err := os.WriteFile(path, js, 0o600); err != nil {
		return nil, err
	}
	url := tg.url
	if url == "" {
		url = "redis://" + tg.opt.Addr
	}
	prefix := cmp.Or(buckets[0].KeyPrefix, "sluice")
	cmd := exec.Command(bin, "serve", "--redis", url, "--prefix", prefix, "--listen", "127.0.0.1:0",
		"--config", path, "--max-waiting", strconv.Itoa(callers+10))
	cmd.Env = append(os.Environ(), "SLUICE_SERVE_DETAIL=1") // each grant's slot, for the checker
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sidecar: starting %s serve: %w", bin, err)
	}
	p := &sidecarProc{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		lines <- line
		io.Copy(io.Discard, r) // until the process exits
		p.done <- cmd.Wait()
	}()
	select {
	case line := <-lines:
		const mark = "listening on "
		i := strings.Index(line, mark)
		if i < 0 {
			p.stop()
			return nil, fmt.Errorf("sidecar: sluice serve did not start: %q %s", line, stderr.String())
		}
		p.base, _, _ = strings.Cut(line[i+len(mark):], " ")
		return p, nil
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
}

// stop ends the server (SIGTERM, as an operator would) and waits for it.
func (p *sidecarProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// sidecarReply is the server's answer to enter, with the detail it adds
// for the bench (SLUICE_SERVE_DETAIL).
type sidecarReply struct {
	Ticket int64             `json:"ticket"`
	Detail *enterdetail.Wire `json:"detail"`
	Error  string            `json:"error"`
}

// enter sends one enter of one call for bucket name.
func (p *sidecarProc) enter(ctx context.Context, hc *http.Client, name string) (sidecarReply, error) {
	var rep sidecarReply
	req, err := http.NewRequestWithContext(ctx, "POST", p.base+"/v1/buckets/"+name+"/enter", nil)
	if err != nil {
		return rep, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return rep, fmt.Errorf("HTTP %d, not the JSON expected: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return rep, errors.New(cmp.Or(rep.Error, resp.Status))
	}
	return rep, nil
}

// notFound sends a request for no endpoint, which the server answers 404
// without Redis.
func (p *sidecarProc) notFound(ctx context.Context, hc *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, "POST", p.base+"/v1/nothing", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusNotFound {
		return fmt.Errorf("HTTP %d, want 404", resp.StatusCode)
	}
	return nil
}

func (s *Sidecar) table(t *table, l Limit) {
	t.title("SIDECAR: %d callers loop enter for %v on one bucket, %d through `sluice serve` (HTTP, kept-alive loopback connections) and %d through the library: capacity %d, %d every %v = %s/s",
		s.Callers, s.Duration, s.Callers-s.Callers/2, s.Callers/2, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond))
	val := func(name, v, note string) { t.row(name, v, "", "", note) }
	val("", "value", "")
	note := fmt.Sprintf("%s through the library, %s through the server; %d errors", commas(s.LibraryGrants), commas(s.SidecarGrants), s.Errors)
	if s.Err != "" {
		note += "; first: " + s.Err
	}
	val("grants", commas(s.Grants), note)
	tp := s.Throughput
	val("utilization", fmt.Sprintf("%.2f %%", 100*tp.Utilization), fmt.Sprintf("%s; rate after the initial burst %s/s over %.3f s, limit %s/s", t.goal(tp.Utilization >= sidecarUtilGoal, "≥ 99 %"), num(tp.Rate), tp.Span.Seconds(), num(tp.Limit)))
	val("excess over the limit, grant times", strconv.Itoa(max(s.ExcessSlots.All, 0)), t.goal(s.ExcessSlots.All <= 0, "0")+"; Redis's clock, both kinds together; "+windows(s.ExcessSlots))
	s.Saturation.limitRows(val)
	val("grants overtaken, by grant time", pct(s.OvertakenSlot, s.Grants), fmt.Sprintf("%s; %d callers granted later than one of either kind that reached Redis after them (retimed ones left out)",
		t.goal(per(int64(s.OvertakenSlot), s.Grants) <= sidecarOvertakenGoal, "≤ 0.5 %"), s.OvertakenSlot))
	s.Saturation.lateRows(val)
	val("uncontended enter, p50 ratio", fmt.Sprintf("%.2f×", s.Ratio), fmt.Sprintf("%s; through the server %s, the library %s (%d each, interleaved)",
		t.goal(s.Ratio <= sidecarRatioGoal, "≤ 2×"), dur(s.EnterSidecar.P50), dur(s.EnterLibrary.P50), s.Uncontended))
	t.Flush()
	t.row("", "p50", "p99", "max", "")
	t.dist("uncontended enter, library", s.EnterLibrary, "one Redis round trip")
	t.dist("uncontended enter, through the server", s.EnterSidecar, "an HTTP request to the server, which makes the library's call")
	t.dist("  an HTTP request alone", s.HTTPAlone, "one the server answers without Redis (a 404): the trip the library's callers do not make")
	t.dist("wait, queued, steady state, library", s.LibraryWait, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.LibraryWait.N), s.Warmup.Round(time.Millisecond)))
	t.dist("wait, queued, steady state, server", s.SidecarWait, fmt.Sprintf("%s requests begun ≥ %v after the first", commas(s.SidecarWait.N), s.Warmup.Round(time.Millisecond)))
	t.dist("lateness: return after grant time", s.Late, "both kinds; a server's caller counts the reply's trip")
}

func (s *Sidecar) gobench(g *gobench) {
	g.line("Sidecar", s.Grants,
		f(s.Throughput.Utilization), "utilization",
		s.ExcessSlots.All, "excess-slots",
		s.ExcessStartsSlack, "excess-starts-slack",
		f(100*per(int64(s.OvertakenSlot), s.Grants)), "pct-overtaken-slot",
		ms(s.LibraryWait.P50), "ms-wait-library-p50",
		ms(s.SidecarWait.P50), "ms-wait-sidecar-p50",
		s.Retimes, "retimes",
		s.Errors, "errors")
	g.line("Sidecar/uncontended", s.Uncontended,
		ms(s.EnterLibrary.P50), "ms-library-p50",
		ms(s.EnterSidecar.P50), "ms-sidecar-p50",
		ms(s.HTTPAlone.P50), "ms-http-alone-p50",
		f(s.Ratio), "sidecar/library")
}
