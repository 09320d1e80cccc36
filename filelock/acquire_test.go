package filelock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

func TestTryAcquireHeldReportsHolder(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	lk, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key, dlock.WithMetadata("job", "x"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	_, err = mustNew(t, dir).TryAcquire(dlocktest.Context(t), key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		t.Fatalf("TryAcquire = %v", err)
	}
	if h := na.Holders[0]; na.Key != key || h.Owner != lk.Owner() || h.Metadata["job"] != "x" || h.TTL <= 0 || h.TTL > dlock.DefaultTTL {
		t.Fatalf("NotAcquiredError = %+v", na)
	}
}

// Waiters on one key, spread over Lockers, all get it in turn.
func TestManyWaiters(t *testing.T) {
	dir := t.TempDir()
	key := dlocktest.Key(t)
	holder, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := mustNew(t, dir).Acquire(dlocktest.Context(t), key)
			if err != nil {
				errs <- err
				return
			}
			errs <- lk.Release(context.Background())
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}
