package sluiceotel_test

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/testing/testmain"
)

var exampleAddr string

// redisAddr is where the examples' Redis listens: a throwaway redis-server
// started for this test binary, so the examples show only user code (use
// your own server's address).
func redisAddr() string { return exampleAddr }

func TestMain(m *testing.M) {
	os.Exit(testmain.Run(m, &exampleAddr))
}
