package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
)

// The reply to a shared or limited attempt's create is lost, for a
// TryAcquire and for a blocking Acquire queued behind another reader: the
// attempt is not reported as a held key, and its entry is removed (by
// Abort) without waiting for its lease, which another lock keeps alive, so
// a writer gets the key once the other reader left.
func TestSharedLostCreateReplyIsAborted(t *testing.T) {
	t.Parallel()
	c, l, lossy := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	ttl := dlock.WithTTL(time.Minute)
	for _, tc := range []struct {
		name string
		try  bool
		opt  dlock.Option
	}{
		{"TryShared", true, dlock.WithShared()},
		{"AcquireShared", false, dlock.WithShared()},
		{"TryLimited", true, dlock.WithLimit(2)},
		{"AcquireLimited", false, dlock.WithLimit(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := dlocktest.Key(t)
			var r *dlock.Lock
			if !tc.try {
				// Another holder of the same mode: the attempt queues
				// and would hold at once.
				var err error
				if r, err = other.Acquire(dlocktest.Context(t), key, tc.opt, ttl); err != nil {
					t.Fatal(err)
				}
			}
			// A lost reply retires its lease: each case takes a fresh
			// one, kept alive by a lock of its own, so that the attempt's
			// first request is its create.
			keeper, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), ttl)
			if err != nil {
				t.Fatal(err)
			}
			defer keeper.Release(context.Background())
			lost := lossy.arm(txnPutUnder(l.QueuePrefix(key)))
			var lk *dlock.Lock
			if tc.try {
				lk, err = l.TryAcquire(dlocktest.Context(t), key, tc.opt, ttl)
			} else {
				lk, err = l.Acquire(dlocktest.Context(t), key, tc.opt, ttl)
			}
			mustHaveLost(t, lost, "the attempt's create")
			if err == nil {
				t.Fatalf("%s: acquired although the reply to its create was lost (token %d)", tc.name, lk.Token())
			} else if errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("a lost reply reported as a held key: %v", err)
			}
			t.Logf("%s: %v", tc.name, err)
			if r != nil {
				rel(t, r)
			}
			ctx, cancel := ctxFor(15 * time.Second) // < the lease (1 min) and its renewal (20s)
			defer cancel()
			w, err := other.Acquire(ctx, key)
			if err != nil {
				t.Fatalf("the entry of the attempt whose reply was lost was left behind: %v", err)
			}
			rel(t, w)
			if err := keeper.Refresh(dlocktest.Context(t)); err != nil {
				t.Fatalf("another lock of the same lease was touched: %v", err)
			}
		})
	}
}

// A reader waits behind a writer over a link that stalls: its Acquire
// returns by its context with an error that says etcd did not answer
// (not ErrNotAcquired), and once the link heals its entry does not keep
// the key beyond its lease: a writer gets the key after the first writer
// left.
func TestSharedWaitOnStalledLink(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	cli := newClient(t, c.Endpoints())
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	w1, err := other.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rch := acquireBG(t, ctx, l, key, dlock.WithShared(), dlock.WithTTL(2*time.Second))
	awaitQueueLen(t, cli, other, key, 2)
	p.Stall()
	// The wait ends once etcd has been silent for longer than the window
	// in which a wait still reports the holder it saw (1s): nothing can
	// arrive over the stalled link meanwhile.
	time.Sleep(2 * time.Second)
	cancel()
	select {
	case a := <-rch:
		if a.err == nil || errors.Is(a.err, dlock.ErrNotAcquired) {
			t.Fatalf("reader waiting over a stalled link: (%v, %v), want an error saying etcd did not answer", a.lk, a.err)
		}
		t.Logf("reader: %v", a.err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the reader's Acquire ignored its context on a stalled link")
	}
	p.Heal()
	rel(t, w1)
	ctx2, cancel2 := ctxFor(10 * time.Second) // the reader's lease (2s) and then some
	defer cancel2()
	w2, err := other.Acquire(ctx2, key)
	if err != nil {
		t.Fatalf("the stalled reader's entry kept the key: %v", err)
	}
	rel(t, w2)
}

// A reader's Release whose reply is lost: the release is retried (or
// settled) and a writer waiting behind the reader gets the key long before
// the reader's lease (1 min) would expire.
// Symptom: a reader's entry outliving its release whose reply was lost, keeping a waiting writer out until the lease expires.
func TestShared_LostReleaseReplyRetried_WriterGetsKey(t *testing.T) {
	t.Parallel()
	c, l, lossy := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	ttl := dlock.WithTTL(time.Minute)
	r, err := l.Acquire(dlocktest.Context(t), key, dlock.WithShared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := other.Acquire(dlocktest.Context(t), key, dlock.WithShared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	wch := acquireBG(t, nil, other, key, ttl)
	awaitQueueLen(t, newClient(t, c.Endpoints()), other, key, 3)
	lost := lossy.arm(txnDeleteUnder(l.QueuePrefix(key)))
	err = r.Release(dlocktest.Context(t))
	mustHaveLost(t, lost, "the reader's Release")
	t.Logf("release with a lost reply: %v", err)
	if err == nil || errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release whose reply was lost = %v, want an error that is not ErrNotHeld", err)
	}
	// Retried by the caller: a release whose reply was lost is not ErrNotHeld.
	if err := r.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("retried release: %v", err)
	}
	rel(t, r2)
	select {
	case a := <-wch:
		if a.err != nil {
			t.Fatalf("writer: %v", a.err)
		}
		if a.lk.Token() <= r2.Token() {
			t.Fatalf("writer token %d not above reader's %d", a.lk.Token(), r2.Token())
		}
		rel(t, a.lk)
	case <-time.After(15 * time.Second):
		t.Fatal("the writer still waits: the reader's entry survived its lost release")
	}
}

// Shared and limited attempts on a stalled link return by their context,
// TryAcquire and Acquire alike, and leave nothing holding the key.
// Symptom: a shared or limited attempt on a stalled link outliving its context, or leaving the key held.
func TestShared_StalledLink_AttemptsReturnByContext(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	r, err := other.Acquire(dlocktest.Context(t), key, dlock.WithShared())
	if err != nil {
		t.Fatal(err)
	}
	// Warm l's connection and lease.
	warm, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	defer warm.Release(context.Background())
	p.Stall()
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		for _, try := range []bool{true, false} {
			ctx, cancel := ctxFor(time.Second)
			done := make(chan error, 1)
			go func() {
				var err error
				if try {
					_, err = l.TryAcquire(ctx, key, opt)
				} else {
					_, err = l.Acquire(ctx, key, opt)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("granted over a stalled link")
				}
			case <-time.After(dlocktest.HangTimeout):
				t.Fatalf("try=%v: hang past its context on a stalled link", try)
			}
			cancel()
		}
	}
	p.Heal()
	rel(t, r)
	ctx, cancel := ctxFor(15 * time.Second)
	defer cancel()
	w, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("writer after the stalled attempts: %v", err)
	}
	rel(t, w)
}
