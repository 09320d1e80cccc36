package etcdlock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Regression (issue 10): a queued Acquire that waited longer than its TTL
// was refused at grant time ("no validity left": the engine ignored a
// lease renewal during the wait, Grant.Start later than the attempt) and
// re-enqueued at the back of the queue, losing its place and a token.
func TestRegressQueuedWaitLongerThanTTL(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	key := dlocktest.Key(t)
	// A lease renewal while waiting must fit in the TTL on a loaded
	// machine: the promise is about the wait outlasting it.
	ttl := 4 * time.Second
	holder, err := etcdlock.New(newClient(t, c.Endpoints())).Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var acquired []dlock.Event
	obs := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAcquire {
			mu.Lock()
			acquired = append(acquired, e)
			mu.Unlock()
		}
	})
	w := etcdlock.New(newClient(t, c.Endpoints()), dlock.WithObserver(obs))
	go func() {
		time.Sleep(2*ttl + ttl/2) // the waiter's lease is renewed while it waits
		holder.Release(dlocktest.Context(t))
	}()
	lk, err := w.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	mu.Lock()
	defer mu.Unlock()
	if len(acquired) != 1 || acquired[0].Attempts != 1 {
		t.Fatalf("acquire events %+v: want one acquisition in one attempt (the queued entry granted, not re-enqueued)", acquired)
	}
	if lk.Token() <= holder.Token() {
		t.Fatalf("token %d not above the holder's %d", lk.Token(), holder.Token())
	}
}
