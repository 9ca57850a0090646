package queue_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

var exampleAddr string

// redisAddr is where the example's Redis listens: a throwaway redis-server
// started for this test binary, so the example shows only user code.
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
	os.Exit(code)
}
