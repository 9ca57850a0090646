// Package workers runs this binary again as worker processes, as separate
// processes of an application would be (each its own Go runtime,
// connections and limiter): the parent passes each one its spec as JSON in
// an environment variable and reads its result as JSON from its stdout.
// The binary's main (or an init hook) checks the variable first.
package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
)

// Run starts one worker per spec, this binary with env set to the spec's
// JSON, waits for them all, and returns their results, decoded from each
// one's stdout, in the specs' order. A worker that fails is an error
// naming it, with its stderr.
func Run[S, R any](ctx context.Context, env string, specs []S) ([]R, error) {
	return RunAs[S, R](ctx, env, specs, nil)
}

// RunAs is Run with each worker's command line made by argv: argv(i,
// self) is the program and arguments that run the i-th worker, and must
// end by executing self, this binary (a wrapper that puts it in a cgroup,
// say). nil: self alone.
func RunAs[S, R any](ctx context.Context, env string, specs []S, argv func(i int, self string) []string) ([]R, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	results := make([]R, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		raw, err := json.Marshal(spec)
		if err != nil {
			return nil, err
		}
		wg.Go(func() {
			line := []string{self}
			if argv != nil {
				line = argv(i, self)
			}
			cmd := exec.CommandContext(ctx, line[0], line[1:]...)
			cmd.Env = append(os.Environ(), env+"="+string(raw))
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("worker %d: %w: %s", i, err, bytes.TrimSpace(stderr.Bytes()))
				return
			}
			errs[i] = json.Unmarshal(out.Bytes(), &results[i])
		})
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// Serve makes this process a worker when env is set: it runs fn with the
// variable's value (the spec's JSON) and exits, with status 0 when fn
// returns nil, else 1 after writing "what: the error" on stderr. It
// returns at once when env is unset; call it first in main or an init
// hook.
func Serve(env, what string, fn func(raw string) error) {
	raw := os.Getenv(env)
	if raw == "" {
		return
	}
	if err := fn(raw); err != nil {
		fmt.Fprintln(os.Stderr, what+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}
