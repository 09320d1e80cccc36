package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
)

// A waiter that gives up is removed from the waiter queue of every node
// (its grants queued it on each), in the background.
func TestRegressDepartedWaitersDequeued(t *testing.T) {
	c := startNodes(t, 3)
	holder := c.locker(t)
	key := dlocktest.Key(t)
	h, err := holder.Acquire(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	l := c.locker(t)
	queued := false
	for i := 0; i < 20; i++ {
		if _, err := l.Acquire(ctxT(t), key, dlock.WithWait(50*time.Millisecond)); err == nil {
			t.Fatal("acquired a held key")
		}
		// At least one wait got as far as queuing (bounded: it may take a
		// few on a slow machine).
		for _, a := range c.admin {
			if n, _ := a.ZCard(context.Background(), lockKey(key)+":waiters").Result(); n > 0 {
				queued = true
			}
		}
	}
	if !queued {
		t.Skip("no wait got as far as queuing")
	}
	for i, a := range c.admin {
		for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
			n, err := a.ZCard(context.Background(), lockKey(key)+":waiters").Result()
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("node %d: %d departed waiters left in the queue (%v)", i, n, err)
			}
		}
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
