package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// The connection drops under a Release's request (gRPC reports a reset
// connection as status Unavailable; here the request reached etcd and its
// reply was lost): Release fails with ErrUnavailable, gRPC's status kept
// in the chain, and a retry succeeds.
// Symptom: Release failing with the bare gRPC error rather than ErrUnavailable.
func TestRelease_Unavailable_ConnectionDroppedUnderRequest(t *testing.T) {
	t.Parallel()
	_, l, r := lossyLocker(t)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lost := r.arm(txnDeleteUnder(l.QueuePrefix(key)))
	err = lk.Release(dlocktest.Context(t))
	mustHaveLost(t, lost, "the Release's delete")
	t.Logf("Release whose connection dropped: %v", err)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Release whose connection dropped: %v, want gRPC's Unavailable kept in the chain", err)
	}
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release whose connection dropped: %v, want ErrUnavailable", err)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
}

func TestLeaseRevokedBehindBack(t *testing.T) {
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
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Lost() not closed after the lease was revoked")
	}
	if !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	// The Locker recovers: a new lease for the next lock.
	lk2, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	lk2.Release(dlocktest.Context(t))
}

// A revoked lease is noticed at once, not at the next renewal (TTL/3 =
// 20s here).
// Symptom: a revoked lease went unnoticed until the renewal at TTL/3.
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

// A Release that failed does not let the next Acquire on the same Locker
// take over the old queue entry (same lease, same token): a retry of the
// first Release would then delete the new holder's entry.
// Symptom: the next Acquire took over the failed Release's entry and token.
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

// A release whose reply was lost (the delete took effect), then retried,
// returns nil, and the key is free.
// Symptom: the retried release reported the lock lost after its first delete had taken effect.
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

// The holder's link stalls; meanwhile its entry is deleted (an operator)
// and another client takes the key. The holder's first Release fails (no
// answer within the request timeout); after the link heals, its retried
// Release finds the entry gone without the receipt that a release of ours
// writes with its delete, and reports the loss.
// Symptom: the retried Release took the foreign delete for its own and returned nil.
func TestForeignDeleteDuringStallIsReportedLost(t *testing.T) {
	t.Parallel()
	p := etcdtest.StartProcess(t)
	u, err := url.Parse(p.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testserver.StartProxy(t, u.Host)
	admin := newClient(t, []string{p.ClientURL()})
	l := etcdlock.New(newClient(t, []string{"http://" + proxy.Addr()}))
	other := etcdlock.New(admin)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // its own-entry watch is running
	proxy.Stall()
	defer proxy.Heal()
	if _, err := admin.Delete(dlocktest.Context(t), l.QueuePrefix(key), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	o, err := other.TryAcquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("other client: %v", err)
	}
	t.Logf("another client holds the key (token %d); the holder's Lost() open: %v", o.Token(), lk.Err() == nil)
	o.Release(dlocktest.Context(t))
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
	err1 := lk.Release(ctx)
	cancel()
	t.Logf("first Release (link stalled): %v", err1)
	proxy.Heal()
	time.Sleep(300 * time.Millisecond)
	err2 := lk.Release(dlocktest.Context(t))
	t.Logf("retried Release: %v", err2)
	if !errors.Is(err2, dlock.ErrLockLost) {
		t.Fatalf("retried Release = %v; the entry was deleted by someone else and the key held by another client while we held it: want ErrLockLost", err2)
	}
}

// A release whose reply is lost on a lease that this Locker retires (it
// also had a create with a lost reply): the lease is revoked once none of
// its entries is live, which deletes the receipt, so the Locker settles
// the release (reads the receipt) before it revokes, and the retried
// Release returns nil.
// Symptom: the lease's revoke deleting the receipt, so that the retried Release reported the lock lost.
func TestLostReleaseReplyOnRevokedLease(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints())
	lossy := &replyLoser{}
	l := etcdlock.New(lossyClient(t, c.Endpoints(), lossy))
	ttl := dlock.WithTTL(time.Minute)
	key, key2 := dlocktest.Key(t), dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	lease := leaseOf(t, admin, l, key)
	// A second lock on the same lease (same TTL) whose create's reply is
	// lost: its outcome is unknown, so the Locker retires the lease.
	lost := lossy.arm(txnPutUnder(l.QueuePrefix(key2)))
	if lk2, err := l.TryAcquire(dlocktest.Context(t), key2, ttl); err == nil {
		t.Fatalf("TryAcquire whose reply was lost succeeded (token %d)", lk2.Token())
	}
	mustHaveLost(t, lost, "the TryAcquire's create")
	lost = lossy.arm(txnDeleteUnder(l.QueuePrefix(key)))
	err1 := lk.Release(dlocktest.Context(t))
	mustHaveLost(t, lost, "the Release's delete")
	if err1 == nil {
		t.Fatal("Release whose reply was lost returned nil")
	}
	t.Logf("first Release: %v", err1)
	// The retired lease is revoked in the background once it has no live
	// entry: wait for it (bounded).
	for i := 0; ; i++ {
		ttlResp, err := admin.TimeToLive(dlocktest.Context(t), lease)
		if err != nil {
			t.Fatal(err)
		}
		if ttlResp.TTL <= 0 {
			break
		}
		if i == 600 {
			t.Fatalf("lease %x not revoked 30s after its last entry was released", int64(lease))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("retried Release after the Locker revoked the lease = %v, want nil (the first request deleted the entry)", err)
	}
}
