package redislock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// A waiter that gives up (its context ends) used to stay in the key's
// waiter queue: nothing removed it but a release popping it (at most 16
// per release), and every later failed attempt pushed the queue's expiry
// further out. Under a lock held for long while clients keep trying with
// bounded waits, the queue grew without bound, and a release then spent
// its pops on departed waiters and woke (and reserved the key for)
// nobody. Now a waiter leaving removes itself, in the background.
//
// The test makes sure each waiter really queued before it leaves, then
// waits for dlock's background work to end (not for the queue to look
// empty): the queue must then hold nobody.
func TestRegressDepartedWaitersStayQueued(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	holder := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	h, err := holder.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	queue := holder.LockKey(key) + ":waiters"
	l := redislock.New(newClient(t, srv))
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(dlocktest.Context(t))
		got := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx, key)
			got <- err
		}()
		waitQueued(t, admin, queue, 1)
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter %d: %v, want context.Canceled", i, err)
		}
		if !background.Wait(dlocktest.HangTimeout) {
			t.Fatalf("hang: background work did not end within %v", dlocktest.HangTimeout)
		}
		if n, err := admin.ZCard(context.Background(), queue).Result(); err != nil || n != 0 {
			t.Fatalf("waiter %d left, and %s still holds %d waiters (%v)", i, queue, n, err)
		}
	}
	// A live waiter now queues; the release wakes it and reserves the key
	// for it.
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err == nil {
			lk.Release(context.Background())
		}
		got <- err
	}()
	waitQueued(t, admin, queue, 1)
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the live waiter: %v", err)
	}
}
