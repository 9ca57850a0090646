package semaphore

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(workerEnv); mode != "" {
		os.Exit(runWorker(mode))
	}
	goleak.VerifyTestMain(m)
}
