package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
)

// A waiter that gives up is removed from the waiter queue of every node
// its attempts queued it on, in the background. The test makes sure the
// waiter queued on a majority before it leaves (an attempt decided by a
// majority does not wait for the last node, which may queue it later or
// never), then waits for dlock's background work to end (not for the
// queues to look empty): no node may then hold it.
// Symptom: a waiter that gave up stayed queued on the nodes.
func TestWatch_DepartedWaiterLeavesEveryQueue(t *testing.T) {
	c := startNodes(t, 3)
	holder := c.locker(t)
	key := dlocktest.Key(t)
	h, err := holder.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	queue := lockKey(key) + ":waiters"
	l := c.locker(t)
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(dlocktest.Context(t))
		got := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx, key)
			got <- err
		}()
		for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(5 * time.Millisecond) {
			queued := 0
			for _, a := range c.admin {
				if q, err := a.ZCard(context.Background(), queue).Result(); err == nil && q == 1 {
					queued++
				}
			}
			if queued >= 2 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("hang: waiter %d queued on %d nodes of 3, want a majority", i, queued)
			}
		}
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter %d: %v, want context.Canceled", i, err)
		}
		if !background.Wait(dlocktest.HangTimeout) {
			t.Fatalf("hang: background work did not end within %v", dlocktest.HangTimeout)
		}
		for n, a := range c.admin {
			if q, err := a.ZCard(context.Background(), queue).Result(); err != nil || q != 0 {
				t.Fatalf("waiter %d left, and node %d still queues %d waiters (%v)", i, n, q, err)
			}
		}
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
