package scheduler_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redistest"
)

var exampleAddr string

// redisAddr is where the examples' Redis listens: a throwaway redis-server
// started for this test binary, so the examples show only user code.
func redisAddr() string { return exampleAddr }

func TestMain(m *testing.M) {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	exampleAddr = srv.Addr()
	code := m.Run()
	srv.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
