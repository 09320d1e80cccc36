package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// receiptDir mirrors the package's directory of release receipts (with
// the default empty prefix).
const receiptDir = "\x00dlock-released/"

// Red-team review 2, finding 1. The holder's link stalls; meanwhile its
// entry is deleted (an operator) and another client takes the key. The
// holder's first Release fails (no answer within the request timeout);
// after the link heals, its retried Release finds the entry gone. The
// heuristic it used to decide (the watch saw no delete, the lease is
// alive) took that for its own delete and returned nil; the receipt that
// a release of ours writes with its delete is not there, so the retried
// Release reports the loss.
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

// Receipts are not locks: dlock cannot name a queue directory that holds
// them, List skips them, a concurrency.Mutex on the key of a released
// lock is not blocked, and they do not pile up: the next release deletes
// the receipts whose outcome is known.
func TestReleaseReceiptsAreNotLocksAndDoNotPileUp(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	if _, err := l.TryAcquire(dlocktest.Context(t), strings.TrimSuffix(receiptDir, "/")); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquire on the receipts' directory name = %v, want ErrInvalidKey", err)
	}
	base := dlocktest.Key(t)
	const n = 20
	for i := 0; i < n; i++ {
		lk, err := l.Acquire(dlocktest.Context(t), base)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(dlocktest.Context(t), receiptDir, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	// Sequential releases: each deletes the previous one's receipt.
	if len(resp.Kvs) != 1 {
		t.Fatalf("%d receipts left after %d sequential releases, want 1 (the last): %q", len(resp.Kvs), n, resp.Kvs)
	}
	if resp.Kvs[0].Lease == 0 {
		t.Fatalf("receipt %q has no lease: it would outlive its lock's lease", resp.Kvs[0].Key)
	}
	infos, err := l.List(dlocktest.Context(t), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if strings.Contains(in.Key, "dlock-released") {
			t.Fatalf("List shows a receipt as a lock: %+v", in)
		}
	}
	if len(infos) != 0 {
		t.Fatalf("List after every release = %+v, want none", infos)
	}
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, base)
	if err := m.TryLock(dlocktest.Context(t)); err != nil {
		t.Fatalf("Mutex on a released key: %v", err)
	}
	m.Unlock(dlocktest.Context(t))
}

// A release whose reply is lost on a lease that this Locker retires (it
// also had a create with a lost reply): the lease is revoked once none of
// its entries is live, which deletes the receipt, so the Locker settles
// the release (reads the receipt) before it revokes, and the retried
// Release returns nil.
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
