// Package testmain is the TestMain of the packages whose examples talk to
// Redis: a throwaway redis-server for the examples, and a check that no
// goroutine outlives the tests.
package testmain

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// Run starts a redis-server for the examples and stores its address in
// *examples, runs m, stops the server, and fails the run if a goroutine
// outlived the tests (goleak). It returns the code for os.Exit. Without a
// redis-server it returns 1 at once, saying so.
func Run(m *testing.M, examples *string) int {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "a redis-server for the examples:", err)
		return 1
	}
	*examples = srv.Addr()
	code := m.Run()
	srv.Close()
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
