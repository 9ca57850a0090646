package semaphore

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(workerEnv); mode != "" {
		os.Exit(runWorker(mode))
	}
	// The examples' Redis: without redis-server they fail, saying so.
	srv, err := redistest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
	} else {
		ExampleRedisAddr = srv.Addr()
	}
	code := m.Run()
	if srv != nil {
		srv.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
