package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Red team (issue 14): Lock.Context of a lock already lost or released
// returned a live context until a goroutine hop later.
func TestRedTeam14_LockContextOfEndedLockIsDone(t *testing.T) {
	l := memlock.New()
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "rt14/lc", dlock.WithTTL(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("rt14/lc")
	<-lk.Lost()
	c, cancel := lk.Context(ctx)
	defer cancel()
	if c.Err() == nil || !errors.Is(context.Cause(c), dlock.ErrLockLost) {
		t.Fatalf("Lock.Context of a lost lock: err %v cause %v", c.Err(), context.Cause(c))
	}
	lk2, _ := l.TryAcquire(ctx, "rt14/lc2")
	lk2.Release(ctx)
	c2, cancel2 := lk2.Context(ctx)
	defer cancel2()
	if c2.Err() == nil || !errors.Is(context.Cause(c2), dlock.ErrReleased) {
		t.Fatalf("Lock.Context of a released lock: err %v cause %v", c2.Err(), context.Cause(c2))
	}
}
