package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

func TestWatchdogStopsWhenIdle(t *testing.T) {
	l := dlock.NewEngine(newSlowClient(newStore()))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if dlock.Renewing(l) != 1 {
		t.Fatalf("renewing %d", dlock.Renewing(l))
	}
	time.Sleep(400 * time.Millisecond)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if dlock.Renewing(l) != 0 {
		t.Fatalf("renewing %d after release", dlock.Renewing(l))
	}
	// goleak in TestMain checks the watchdog goroutine has exited.
}
