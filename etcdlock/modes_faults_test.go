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
