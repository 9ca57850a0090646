package semaphore

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/testing/testmain"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(workerEnv); mode != "" {
		os.Exit(runWorker(mode))
	}
	os.Exit(testmain.Run(m, &ExampleRedisAddr))
}
