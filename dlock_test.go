package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// hangTimeout bounds every wait in these tests; exceeding it is a hang.
const hangTimeout = 30 * time.Second

// overrunBound is how far past its context's deadline a call may return
// before the test calls it a hang. It is generous on purpose (a slow
// machine must not fail the test); the overruns it catches are seconds
// long (a default go-redis client waits 3s per read, then retries).
const overrunBound = 2 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangTimeout)
	t.Cleanup(cancel)
	return ctx
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitFor polls cond every millisecond until it holds, or fails as a hang.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(hangTimeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("hang: %s did not happen within %v", what, hangTimeout)
		}
	}
}

func TestNilArguments(t *testing.T) {
	if err := dlock.Do(context.Background(), nil, "k", func(context.Context, *dlock.Lock) error { return nil }); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("Do(nil locker) = %v", err)
	}
	//lint:ignore SA1012 checking that a nil context is an error, not a panic
	if _, err := memlock.New().Acquire(nil, "k"); err == nil { //nolint:staticcheck
		t.Fatal("nil context accepted")
	}
}
