package buckettest

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestNew: a bucket without a name is named after the test, a name given
// is kept, the bucket is closed when its test ends, and a bad
// configuration fails the test.
func TestNew(t *testing.T) {
	rdb := redistest.New(t).Client()
	t.Cleanup(func() { rdb.Close() })
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}

	var inner *bucket.Bucket
	t.Run("unnamed", func(t *testing.T) {
		inner = New(t, rdb, cfg)
		if got := inner.Config().Name; got != t.Name() {
			t.Errorf("Name = %q, want the test's name %q", got, t.Name())
		}
	})
	if err := inner.Enter(context.Background()); !errors.Is(err, sluice.ErrClosed) {
		t.Errorf("Enter after the subtest ended = %v, want ErrClosed", err)
	}

	named := cfg
	named.Name = "given"
	if got := New(t, rdb, named).Config().Name; got != "given" {
		t.Errorf("Name = %q, want %q", got, "given")
	}

	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(ft, rdb, bucket.Config{Capacity: -1})
	}()
	<-done
	if !ft.failed {
		t.Error("New with a bad configuration did not fail the test")
	}
}

// fatalT records Fatal and ends its goroutine, as testing.T does.
type fatalT struct {
	testing.TB
	failed bool
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatal(...any) {
	f.failed = true
	runtime.Goexit()
}
