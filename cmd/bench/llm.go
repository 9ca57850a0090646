package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

// LLM is an LLM API's two limits, requests and tokens, shared by callers
// in several worker processes: an upstream on loopback
// (upstreamtest.LLM) that takes a call's prompt + max_tokens when it
// arrives, refuses it with 429 when either limit lacks room, and gives
// back what the output did not use when the call ends; the callers send
// through a transport.Transport around one bucket.Bucket counting
// requests and tokens, fed back OpenAI's headers. Each run is made twice:
// reserving each call's prompt + max_tokens and settling it at the usage
// the answer reports (transport.WithReserve), and charging that estimate
// alone (EnterCost), as a limiter that cannot know the output does; and a
// third time reserving and settling, with the bucket's policies equal to
// the upstream's and the workers' connections cold (issue 31: the first
// calls arrive a few ms after their slots, while the upstream, full,
// loses its refills).
type LLM struct {
	Procs    int           `json:"procs"`
	Callers  int           `json:"callers"`
	Duration time.Duration `json:"duration_ns"` // of each run
	Requests int           `json:"upstream_requests_per_s"`
	Tokens   int           `json:"upstream_tokens_per_s"`
	Latency  time.Duration `json:"latency_ns"` // of each call
	Rows     []LLMRow      `json:"rows"`
}

// LLMRow is one run, as the upstream saw it.
type LLMRow struct {
	Charge string `json:"charge"` // llmSettle, llmEstimate or llmExactCold
	// Arrivals is every call the upstream judged; Refused those it
	// answered 429.
	Arrivals int `json:"arrivals"`
	Accepted int `json:"accepted"`
	Refused  int `json:"refused_429"`
	// Used is the tokens the accepted calls used (prompts and outputs),
	// Quota what the upstream's token limit allowed from the first
	// arrival to the last (its burst, plus its rate over that span), and
	// Utilization the one over the other.
	Used        int64   `json:"tokens_used"`
	Quota       float64 `json:"token_quota"`
	Utilization float64 `json:"utilization"`
	// Reserved is what the accepted calls took at arrival, prompt +
	// max_tokens.
	Reserved int64         `json:"tokens_reserved"`
	Span     time.Duration `json:"span_ns"`
	// Errors counts calls that failed in the workers (not an answer of
	// the upstream); Err is the first.
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
}

// The ways a call is charged.
const (
	llmSettle   = "settle"   // Reserve prompt + max_tokens, Settle at the usage
	llmEstimate = "estimate" // EnterCost of prompt + max_tokens
	// llmExactCold settles as llmSettle, the bucket's policies equal to
	// the upstream's (no headroom), and the workers start on cold
	// connections: no Ping before the start.
	llmExactCold = "settle-exact-cold"
)

// The goals of the settled run.
const (
	llmUtilization = 0.95  // tokens used / the upstream's token quota
	llmRefused     = 0.005 // share of calls refused
)

// llmHeadroom is the share of the upstream's bursts the bucket holds: a
// call granted from a full bucket crosses loopback before the upstream
// takes its tokens, and meanwhile the upstream, full too, drops its
// refills; a call granted right after would then find the upstream short
// (the at-limit rows of the upstream scenario show it).
const llmHeadroom = 0.95

// The calls' sizes: prompt_tokens and max_tokens drawn uniformly, the
// output from 10 to 100 % of max_tokens (the upstream draws it).
const (
	llmPromptMin, llmPromptMax = 50, 250
	llmMaxMin, llmMaxMax       = 500, 1500
)

// llmEnv makes this binary a worker of the llm scenario (llmWorker).
const llmEnv = "SLUICE_BENCH_LLM_WORKER"

// The scenario's worker processes are this binary run again; here rather
// than in main so that the scenario stays in its file.
func init() { workers.Serve(llmEnv, "llm worker", llmWorker) }

func (*LLM) about() about {
	return about{name: "llm", takes: "~50 s",
		what: "an LLM API's requests and tokens limits shared by several processes through the transport: each call's tokens reserved, then settled at its usage, against charging the estimate; and settled with the bucket at the upstream's bursts on cold connections"}
}

func (l *LLM) flags(fs *flag.FlagSet) {
	fs.IntVar(&l.Procs, "llm-procs", 4, "worker processes")
	fs.IntVar(&l.Callers, "llm-callers", 32, "callers in total, spread over the processes")
	fs.DurationVar(&l.Duration, "llm-duration", 15*time.Second, "how long each of the two runs lasts")
	fs.IntVar(&l.Requests, "llm-requests", 60, "the upstream's requests a second, and its burst")
	fs.IntVar(&l.Tokens, "llm-tokens", 20_000, "the upstream's tokens a second, and its burst")
	fs.DurationVar(&l.Latency, "llm-latency", 100*time.Millisecond, "how long the upstream takes to answer a call")
}

func (l *LLM) check() error {
	if err := checkLoad("llm-", l.Callers, l.Procs, l.Duration); err != nil {
		return err
	}
	largest := float64(llmPromptMax + llmMaxMax)
	switch {
	case l.Requests < 1:
		return fmt.Errorf("--llm-requests %d: want ≥ 1", l.Requests)
	case float64(l.Tokens)*llmHeadroom < largest:
		return fmt.Errorf("--llm-tokens %d: want ≥ %d, so that the largest call fits the bucket", l.Tokens, int(largest/llmHeadroom)+1)
	case l.Latency < 0:
		return fmt.Errorf("--llm-latency %v: want ≥ 0", l.Latency)
	}
	return nil
}

func (l *LLM) run(ctx context.Context, e *env) error {
	l.Rows = nil
	for _, charge := range []string{llmSettle, llmEstimate, llmExactCold} {
		e.logf("llm: charging %s: %d callers in %d processes for %v, upstream %d requests/s and %d tokens/s...",
			charge, l.Callers, l.Procs, l.Duration, l.Requests, l.Tokens)
		row, err := l.runOnce(ctx, e, charge)
		if err != nil {
			return fmt.Errorf("charging %s: %w", charge, err)
		}
		l.Rows = append(l.Rows, row)
	}
	return nil
}

// runOnce starts a fresh upstream, runs the workers against it through a
// fresh bucket, and reads what the upstream counted.
func (l *LLM) runOnce(ctx context.Context, e *env, charge string) (LLMRow, error) {
	up := upstreamtest.NewLLM(upstreamtest.LLMConfig{
		Requests: upstreamtest.Policy{Rate: l.Requests, Burst: l.Requests},
		Tokens:   upstreamtest.Policy{Rate: l.Tokens, Burst: l.Tokens},
		Latency:  l.Latency, Seed: 1,
	})
	defer up.Close()
	headroom := llmHeadroom
	if charge == llmExactCold {
		headroom = 1
	}
	requests := bucket.Rate(l.Requests, time.Second, max(int(float64(l.Requests)*headroom), 1))
	tokens := bucket.Rate(l.Tokens, time.Second, int(float64(l.Tokens)*headroom))
	tokens.Unit = "tokens"
	cfg := bucket.Config{Name: e.name + "-" + charge, Policies: []bucket.Policy{requests, tokens}}
	// Time for the workers to start and connect before the run begins.
	begin := time.Now().Add(time.Second)
	specs := make([]llmSpec, l.Procs)
	for i := range specs {
		specs[i] = llmSpec{Proc: i, workerTarget: e.workers(), Bucket: cfg, Upstream: up.URL(), Callers: share(l.Callers, l.Procs, i),
			Settle: charge != llmEstimate, Cold: charge == llmExactCold, Begin: begin.UnixNano(), Until: begin.Add(l.Duration).UnixNano()}
	}
	results, err := workers.Run[llmSpec, llmResult](ctx, llmEnv, specs)
	if err != nil {
		return LLMRow{}, err
	}
	st := up.Stats()
	row := LLMRow{Charge: charge, Arrivals: st.Arrivals, Accepted: st.Accepted, Refused: st.Refused,
		Used: st.Used(), Quota: st.TokenQuota, Reserved: st.Reserved, Span: st.Last.Sub(st.First)}
	if st.TokenQuota > 0 {
		row.Utilization = float64(st.Used()) / st.TokenQuota
	}
	for _, r := range results {
		row.Errors += r.Errors
		if row.Err == "" {
			row.Err = r.Err
		}
	}
	if st.Invalid > 0 {
		row.Errors += st.Invalid
		if row.Err == "" {
			row.Err = fmt.Sprintf("the upstream answered %d calls 400", st.Invalid)
		}
	}
	return row, nil
}

// llmSpec is one worker process's share of a run.
type llmSpec struct {
	Proc int `json:"proc"` // seeds its calls' sizes
	workerTarget
	Bucket   bucket.Config `json:"bucket"`
	Upstream string        `json:"upstream"`
	Callers  int           `json:"callers"`
	Settle   bool          `json:"settle"`         // reserve and settle; else charge the estimate
	Cold     bool          `json:"cold,omitempty"` // no Ping before the start: the first calls connect
	Begin    int64         `json:"begin_unix_ns"`  // the callers start then
	Until    int64         `json:"until_unix_ns"`  // and send nothing new after
}

// llmResult is what a worker process reports.
type llmResult struct {
	Calls  int    `json:"calls"` // answered by the upstream, retries not counted
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
}

// llmCall is the body of a call: what upstreamtest.LLM reads.
type llmCall struct {
	Prompt        int               `json:"prompt_tokens"`
	Max           int               `json:"max_tokens"`
	Stream        bool              `json:"stream,omitempty"`
	StreamOptions *llmStreamOptions `json:"stream_options,omitempty"`
}

type llmStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// llmCost is a call's cost before it is sent, from its body as the
// transport sends it: one request, and its prompt and max_tokens.
func llmCost(req *http.Request) bucket.Cost {
	var c llmCall
	if req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			json.NewDecoder(body).Decode(&c)
			body.Close()
		}
	}
	return bucket.Cost{"": 1, "tokens": c.Prompt + c.Max}
}

// llmWorker is one worker process: its callers send calls of random sizes
// to the upstream, half of them streamed, through a Transport around the
// shared bucket until the spec's end, and it writes an llmResult to
// stdout.
func llmWorker(raw string) error {
	var spec llmSpec
	ctx, stop, opt, err := openWorker(raw, &spec)
	if err != nil {
		return err
	}
	defer stop()
	rdb := client(opt, spec.Callers)
	defer rdb.Close()
	if !spec.Cold {
		if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
			return err
		}
	}
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return err
	}
	defer b.Close()
	charge := transport.WithReserve(llmCost, transport.OpenAIUsage)
	if !spec.Settle {
		charge = transport.WithEnter(func(ctx context.Context, req *http.Request) error {
			return b.EnterCost(ctx, llmCost(req))
		})
	}
	base := &http.Transport{MaxIdleConnsPerHost: spec.Callers}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: transport.New(base, b, transport.WithHeaders(upstream.OpenAI), charge)}

	select {
	case <-time.After(time.Until(time.Unix(0, spec.Begin))):
	case <-ctx.Done():
		return ctx.Err()
	}
	until := time.Unix(0, spec.Until)
	// Calls still waiting or running at the end are let go: the run is
	// over, and the upstream has counted what it accepted.
	runCtx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var (
		mu  sync.Mutex
		res llmResult
		wg  sync.WaitGroup
	)
	for i := range spec.Callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(spec.Proc), uint64(i)))
			for runCtx.Err() == nil {
				call := llmCall{Prompt: llmPromptMin + rng.IntN(llmPromptMax-llmPromptMin+1), Max: llmMaxMin + rng.IntN(llmMaxMax-llmMaxMin+1)}
				if rng.IntN(2) == 0 {
					call.Stream = true
					call.StreamOptions = &llmStreamOptions{IncludeUsage: true}
				}
				body, _ := json.Marshal(call)
				req, _ := http.NewRequestWithContext(runCtx, "POST", spec.Upstream, strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := c.Do(req)
				if runEnds(err) {
					return
				}
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				// The run's end is not an error (see upstreamWorker).
				if err != nil && runCtx.Err() == nil && time.Until(until) > time.Millisecond {
					mu.Lock()
					res.Errors++
					if res.Err == "" {
						res.Err = err.Error()
					}
					mu.Unlock()
					continue
				}
				if err == nil {
					mu.Lock()
					res.Calls++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(res)
}

func (l *LLM) table(t *table, _ Limit) {
	t.title("LLM: an upstream limiting %s requests and %s tokens a second (bursts the same; a call takes prompt + max_tokens when it arrives, gets back what its output, 10–100 %% of max_tokens, did not use %v later), called through the transport by %d callers in %d processes sharing one bucket with a policy for each limit (%.0f %% of the bursts but in the last row)",
		commas(l.Requests), commas(l.Tokens), l.Latency, l.Callers, l.Procs, 100*llmHeadroom)
	t.row("each call charged", "tokens used / the upstream's token quota", "refused (429)", "tokens used", "quota", "")
	for _, r := range l.Rows {
		share := per(int64(r.Refused), r.Arrivals)
		var name, verdict string
		switch r.Charge {
		case llmSettle:
			name = "reserved, then settled at its usage"
			verdict = t.goal(r.Utilization >= llmUtilization, "tokens used ≥ 0.95 of the quota") + "; " + t.goal(share <= llmRefused, "refused ≤ 0.5 %")
		case llmExactCold:
			name = "the same, the bucket at 100 % of the bursts, cold connections"
			verdict = t.goal(r.Utilization >= llmUtilization, "tokens used ≥ 0.95 of the quota") + "; " + t.goal(r.Refused == 0, "none refused")
		default:
			name = "its estimate, prompt + max_tokens"
			verdict = "no goal: for contrast; the output's unused tokens are never given back"
		}
		if r.Errors > 0 {
			verdict += fmt.Sprintf("; %d errors, first: %s", r.Errors, r.Err)
		}
		t.row(name, fmt.Sprintf("%.4f", r.Utilization), fmt.Sprintf("%s of %s", pct(r.Refused, r.Arrivals), commas(r.Arrivals)),
			commas(int(r.Used)), commas(int(r.Quota)), verdict)
	}
}

func (l *LLM) gobench(g *gobench) {
	for _, r := range l.Rows {
		g.line("LLM/charge="+r.Charge, r.Arrivals, f(r.Utilization), "utilization", f(100*per(int64(r.Refused), r.Arrivals)), "pct-refused", r.Errors, "errors")
	}
}
