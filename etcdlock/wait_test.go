package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

func TestFIFO(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints())
	key := dlocktest.Key(t)
	holder, err := etcdlock.New(newClient(t, c.Endpoints())).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		l := etcdlock.New(newClient(t, c.Endpoints()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, err := l.Acquire(dlocktest.Context(t), key)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			lk.Release(dlocktest.Context(t))
		}()
		// Wait until waiter i is queued before starting the next.
		deadline := time.Now().Add(dlocktest.HangTimeout)
		for {
			resp, err := admin.Get(dlocktest.Context(t), key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Count == int64(i+2) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("hang: waiter not queued")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	holder.Release(dlocktest.Context(t))
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
}

// A waiter whose lease expires while it waits (a renewal a loaded machine
// sent late, or an operator's revoke) queues again, on a new lease, and
// gets the key after the holder's release.
// Symptom: a waiter whose lease expired failed its Acquire instead of queueing again.
func TestWait_LeaseExpiredQueuesAgain(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints())
	key := dlocktest.Key(t)
	holder, err := etcdlock.New(newClient(t, c.Endpoints())).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	waiter := etcdlock.New(newClient(t, c.Endpoints()))
	type result struct {
		lk  *dlock.Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := waiter.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Second))
		res <- result{lk, err}
	}()
	// queued waits for the waiter's entry (the second in the queue) on a
	// lease other than not, and returns its lease.
	queued := func(not int64) int64 {
		deadline := time.Now().Add(dlocktest.HangTimeout)
		for {
			resp, err := admin.Get(dlocktest.Context(t), key+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 2 && resp.Kvs[1].Lease != not {
				return resp.Kvs[1].Lease
			}
			if time.Now().After(deadline) {
				t.Fatal("hang: waiter never queued")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	lease := queued(0)
	if _, err := admin.Revoke(dlocktest.Context(t), clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	queued(lease) // queued again, on a new lease
	select {
	case r := <-res:
		t.Fatalf("waiter whose lease expired returned (%v, %v) while the key was held", r.lk, r.err)
	default:
	}
	holder.Release(dlocktest.Context(t))
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("waiter whose lease expired, after the holder's release: %v", r.err)
		}
		if r.lk.Token() <= holder.Token() {
			t.Fatalf("token %d after the holder's %d", r.lk.Token(), holder.Token())
		}
		r.lk.Release(dlocktest.Context(t))
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: waiter never got the key after the holder's release")
	}
}

// A queued Acquire that waits longer than its TTL (its lease renewed while
// it waits, so Grant.Start is later than the attempt) is granted in one
// attempt: it keeps its place in the queue.
// Symptom: such a wait was refused at grant time ("no validity left") and queued again at the back.
func TestWait_LongerThanTTL_GrantedInOneAttempt(t *testing.T) {
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

// A waiter whose context ends while etcd keeps answering (if slowly)
// returns at once with the holder, and removes its entry in the
// background rather than before returning.
// Symptom: over a slow link such a wait reported ErrUnavailable instead of the holder.
func TestQueueReportsHolderWhenContextEnds(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	holderL := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	holder, err := holderL.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := ctxFor(5 * time.Second)
		defer cancel()
		_, err := l.Acquire(ctx, key)
		errc <- err
	}()
	awaitQueueLen(t, newClient(t, c.Endpoints()), holderL, key, 2) // the waiter is queued
	p.Delay(60 * time.Millisecond)                                 // every round trip now takes > the core's 100ms grace
	var err2 error
	select {
	case err2 = <-errc:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire ignored its context")
	}
	var na *dlock.NotAcquiredError
	if !errors.As(err2, &na) || !errors.Is(err2, context.DeadlineExceeded) {
		t.Fatalf("Acquire whose context ended while waiting = %v, want a *NotAcquiredError with the context's error", err2)
	}
	if len(na.Holders) != 1 || na.Holders[0].Owner != holder.Owner() || na.Holders[0].Token != holder.Token() {
		t.Fatalf("reported holders %+v, want owner %q token %d", na.Holders, holder.Owner(), holder.Token())
	}
	p.Heal()
	// The waiter's entry is gone (removed in the background): after the
	// holder's release the key is free, not held by the waiter's leftover.
	holder.Release(dlocktest.Context(t))
	lk, err := holderL.Acquire(dlocktest.Context(t), key, dlock.WithWait(10*time.Second))
	if err != nil {
		t.Fatalf("the waiter's entry was left behind: %v", err)
	}
	lk.Release(context.Background())
}
