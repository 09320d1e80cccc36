package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// proxied returns a one-member cluster, a Locker that reaches it through
// a fault proxy, and that proxy.
func proxied(t *testing.T) (*etcdtest.Cluster, *etcdlock.Locker, *testserver.Proxy) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	u, err := url.Parse(c.Members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testserver.StartProxy(t, u.Host)
	l := etcdlock.New(newClient(t, []string{"http://" + p.Addr()}))
	t.Cleanup(p.Heal)
	return c, l, p
}

// lossyLocker is a Locker on a one-member cluster whose client loses the
// reply to the requests r is armed for.
func lossyLocker(t *testing.T) (*etcdtest.Cluster, *etcdlock.Locker, *replyLoser) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	r := &replyLoser{}
	return c, etcdlock.New(lossyClient(t, c.Endpoints(), r)), r
}

func ctxFor(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// Defect 1: a Release that failed must not let the next Acquire on the
// same Locker take over the old queue entry (same lease, same token): a
// retry of the first Release would then delete the new holder's entry.
func TestFailedReleaseThenAcquireKeepsNewHolder(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	a, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	p.Cut()
	ctx, cancel := ctxFor(300 * time.Millisecond)
	err = a.Release(ctx)
	cancel()
	if err == nil {
		t.Fatal("Release through a cut link succeeded")
	}
	p.Heal()
	b, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background())
	if b.Token() == a.Token() {
		t.Fatalf("the new lock was handed the failed release's entry (token %d)", b.Token())
	}
	t.Logf("retried release of the first lock: %v", a.Release(dlocktest.Context(t)))
	if err := b.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("the retried release of the old lock took the new one: %v", err)
	}
	if _, err := other.TryAcquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TWO HOLDERS: another client's TryAcquire = %v while the new lock is held", err)
	}
	if b.Err() != nil {
		t.Fatalf("new lock: %v", b.Err())
	}
}

// Defect 1: an entry whose delete failed does not linger while another
// lock keeps the shared lease alive: its delete is retried with the
// lease's next keep-alive.
func TestFailedReleaseDoesNotLingerOnSharedLease(t *testing.T) {
	t.Parallel()
	c, l, p := proxied(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key, key2 := dlocktest.Key(t), dlocktest.Key(t)
	ttl := dlock.WithTTL(3 * time.Second)
	a, err := l.Acquire(dlocktest.Context(t), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := l.Acquire(dlocktest.Context(t), key2, ttl) // same TTL: same lease
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(context.Background())
	p.Cut()
	ctx, cancel := ctxFor(300 * time.Millisecond)
	err = a.Release(ctx)
	cancel()
	if err == nil {
		t.Fatal("Release through a cut link succeeded")
	}
	p.Heal()
	// The lease is renewed every second by keeper: without the retried
	// delete the key would stay held as long as keeper is.
	lk, err := other.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("the entry whose release failed lingered: %v", err)
	}
	lk.Release(context.Background())
	if keeper.Err() != nil {
		t.Fatalf("keeper: %v", keeper.Err())
	}
}

// Defect 2: a short lock taken on a shared lease that is no longer fresh
// for the lock's own TTL (but still is for the lease's, which etcd raises
// to its minimum) is alive when it is handed out.
func TestShortTTLOnReusedLeaseIsAliveAtBirth(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ttl := dlock.WithTTL(300 * time.Millisecond)
	for i := 0; i < 3; i++ {
		lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), ttl)
		if err != nil {
			t.Fatal(err)
		}
		lk.Release(context.Background())
		time.Sleep(400 * time.Millisecond) // > the lock's TTL, < a third of etcd's 2s minimum lease
		lk, err = l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t), ttl)
		if err != nil {
			t.Fatalf("TryAcquire on a reused lease: %v", err)
		}
		if lk.Err() != nil || !time.Now().Before(lk.Deadline()) {
			t.Fatalf("lock handed out already lost (deadline %v ago): %v", time.Since(lk.Deadline()), lk.Err())
		}
		lk.Release(context.Background())
	}
}

// Defect 3: a revoked lease is noticed at once, not at the next renewal
// (TTL/3 = 20s here).
func TestRevokedLeaseNoticedBeforeRenewal(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := l.List(dlocktest.Context(t), key)
	if err != nil || len(infos) != 1 {
		t.Fatal(infos, err)
	}
	if _, err := admin.Revoke(dlocktest.Context(t), leaseOf(t, admin, l, key)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(15 * time.Second):
		t.Fatal("a revoked lease was not noticed before the next renewal")
	}
	if !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v, want ErrNotHeld", lk.Err())
	}
	if err := lk.Release(dlocktest.Context(t)); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release of a lock whose lease was revoked = %v, want ErrLockLost", err)
	}
}

// Defect 5: a waiter whose context ends while etcd keeps answering (if
// slowly) returns at once with the holder, and removes its entry in the
// background rather than before returning.
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

// Defect 5: the reply to an acquisition's create is lost: Abort finds the
// entry by its owner and deletes it (not another owner's), and the key is
// free without waiting for the lease, which another lock keeps alive.
func TestLostCreateReplyIsAborted(t *testing.T) {
	t.Parallel()
	c, l, r := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	key, key2 := dlocktest.Key(t), dlocktest.Key(t)
	ttl := dlock.WithTTL(time.Minute)
	keeper, err := l.Acquire(dlocktest.Context(t), key2, ttl) // keeps the shared lease alive
	if err != nil {
		t.Fatal(err)
	}
	defer keeper.Release(context.Background())
	lost := r.arm(txnPutUnder(l.QueuePrefix(key)))
	lk, err := l.TryAcquire(dlocktest.Context(t), key, ttl)
	mustHaveLost(t, lost, "the TryAcquire's create")
	if err == nil {
		t.Fatalf("TryAcquire whose reply was lost succeeded (token %d)", lk.Token())
	} else if errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("a lost reply reported as a held key: %v", err)
	}
	ctx, cancel := ctxFor(15 * time.Second) // < the lease (1 min) and its renewal (20s)
	defer cancel()
	lk2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("the entry of the attempt whose reply was lost was left behind: %v", err)
	}
	lk2.Release(context.Background())
	if err := keeper.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("another lock of the same lease was touched: %v", err)
	}
}

// Defect 6: a release whose reply was lost (the delete took effect), then
// retried, returns nil, and the key is free.
func TestReleaseRetriedAfterLostReply(t *testing.T) {
	t.Parallel()
	c, l, r := lossyLocker(t)
	other := etcdlock.New(newClient(t, c.Endpoints()))
	for i := 0; i < 3; i++ {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		lost := r.arm(txnDeleteUnder(l.QueuePrefix(key)))
		err = lk.Release(dlocktest.Context(t))
		mustHaveLost(t, lost, "the Release's delete")
		if err == nil {
			t.Fatal("Release whose reply was lost returned nil")
		}
		t.Logf("first Release: %v", err)
		if errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("a lost release reply reported as a lost lock: %v", err)
		}
		if err = lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatalf("retried Release: %v", err)
		}
		if !errors.Is(lk.Err(), dlock.ErrReleased) {
			t.Fatalf("Err() = %v, want ErrReleased", lk.Err())
		}
		lk2, err := other.TryAcquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("key not free after the release: %v", err)
		}
		lk2.Release(context.Background())
	}
}

// Defect 7: List returns by its context's deadline on a stalled link.
func TestListHonoursContext(t *testing.T) {
	t.Parallel()
	_, l, p := proxied(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	ctx, cancel := ctxFor(300 * time.Millisecond)
	start := time.Now()
	_, err = l.List(ctx, key)
	cancel()
	if over := time.Since(start) - 300*time.Millisecond; over > dlocktest.OverrunBound || err == nil {
		t.Fatalf("List on a stalled link: %v after %v", err, time.Since(start))
	}
	p.Heal()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
}
