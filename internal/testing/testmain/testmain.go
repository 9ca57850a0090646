// Package testmain is the TestMain of the packages whose examples talk to
// Redis: a throwaway redis-server for the examples, and a check that no
// goroutine outlives the tests.
package testmain

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// Run starts a redis-server for the examples and stores its address in
// *examples, runs m, stops the server, and fails the run if a goroutine
// outlived the tests (goleak). It returns the code for os.Exit. Without a
// redis-server on PATH the examples get an in-process miniredis, said
// loudly, as redistest.New's tests do, so that the tests written for
// miniredis run everywhere; with CI=true it returns 1 at once instead.
func Run(m *testing.M, examples *string) int {
	stop, err := serve(examples)
	if err != nil {
		fmt.Fprintln(os.Stderr, "a redis-server for the examples:", err)
		return 1
	}
	code := m.Run()
	stop()
	if code == 0 {
		// go-redis's pool re-dials a server that refused it once a second
		// on a goroutine of its own, which ends at its next wake-up once
		// the client is closed: a test that closed a client while its
		// Redis was dead leaves one for up to a second.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// serve starts the examples' server and returns its stop.
func serve(examples *string) (stop func(), err error) {
	srv, err := redistest.Start()
	if err == nil {
		*examples = srv.Addr()
		return srv.Close, nil
	}
	if !errors.Is(err, redistest.ErrNoRedisServer) || os.Getenv("CI") == "true" {
		return nil, err
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("miniredis: %w", err)
	}
	fmt.Fprintln(os.Stderr, "!!! testmain: redis-server not on PATH: the examples use an in-process miniredis. Install redis-server for real results.")
	*examples = mr.Addr()
	return mr.Close, nil
}
