package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
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
func TestRegressDepartedWaitersStayQueued(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := newClient(t, srv)
	holder := redislock.New(newClient(t, srv))
	key := dlocktest.Key(t)
	h, err := holder.Acquire(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	l := redislock.New(newClient(t, srv))
	for i := 0; i < 100; i++ {
		_, err := l.Acquire(ctxT(t), key, dlock.WithWait(20*time.Millisecond))
		if err == nil {
			t.Fatal("acquired a held key")
		}
	}
	queue := holder.LockKey(key) + ":waiters"
	// The departed waiters dequeue themselves in the background: wait
	// (bounded) for the queue to empty.
	waitQueued(t, admin, queue, 0)
	// A live waiter now queues; the release wakes it and reserves the key
	// for it.
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctxT(t), key)
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
