package etcdlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) {
	etcdtest.Serve() // in a child of StartProcess: serve etcd, never return
	testserver.Main(m,
		// Process-wide singletons of the embedded etcd server and gRPC.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

func newClient(t testing.TB, eps []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// leaseOf returns the etcd lease of key's holder in l's layout, read from
// the head of its queue through cli.
func leaseOf(t testing.TB, cli *clientv3.Client, l *etcdlock.Locker, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(dlocktest.Context(t), l.QueuePrefix(key), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("queue of %q: %v, %v", key, resp, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// harnessOn is the conformance harness for the cluster serving eps. Its
// short lease is 4s. etcd's shortest lease is 2s by default (1.5 × the
// election timeout, rounded up to whole seconds), but on a loaded 2-core
// machine running the race detector a renewal's round trip can take more
// than the 1.3s that a 2s lease leaves it, and a renewed lock was rightly
// reported lost: the suite's promises do not depend on the TTL, only on
// renewals fitting in it. The same holds for the leases of waiting
// entries, which ShortTTLContention takes at ShortTTL: a waiter whose
// lease expires loses its place and queues again at the back.
func harnessOn(eps []string, admin *clientv3.Client) dlocktest.Harness {
	return dlocktest.Harness{
		TTL:      4 * time.Second,
		ShortTTL: 4 * time.Second,
		New:      func(t testing.TB) dlock.Locker { return etcdlock.New(newClient(t, eps)) },
		Expire: func(t testing.TB, key string) {
			pfx := etcdlock.New(admin).QueuePrefix(key)
			if _, err := admin.Delete(context.Background(), pfx, clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
		},
		NoticesDeletion: true,
		FIFO:            true,
	}
}

// The member runs in a child process, as TestConformanceCluster's do.
func TestConformanceSingle(t *testing.T) {
	t.Parallel()
	eps := etcdtest.ProcessEndpoints(etcdtest.StartProcesses(t, 1))
	dlocktest.TestLocker(t, harnessOn(eps, newClient(t, eps)))
}

// The members run in child processes, as a real cluster's do: in the test
// process, the suite's clients (under the race detector) starved the
// members' heartbeats and replies, and leases of 2s expired.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	eps := etcdtest.ProcessEndpoints(etcdtest.StartProcesses(t, 3))
	dlocktest.TestLocker(t, harnessOn(eps, newClient(t, eps)))
}

// A lock held across the loss of the cluster leader is either still held
// (and nobody else can take it) or reported lost; never silently lost.
func TestLeaderLoss(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 3)
	eps := c.Endpoints()
	l := etcdlock.New(newClient(t, eps))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	leader := c.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Stop()
	time.Sleep(4 * time.Second) // two TTLs: an election and some renewals
	other := etcdlock.New(newClient(t, c.Endpoints()))
	// Ask the surviving members until they answer (a new leader is elected).
	var tryErr error
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var lk2 *dlock.Lock
		lk2, tryErr = other.TryAcquire(ctx, key)
		cancel()
		if tryErr == nil {
			lk2.Release(context.Background())
		}
		if tryErr == nil || errors.Is(tryErr, dlock.ErrNotAcquired) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case lk.Err() == nil && errors.Is(tryErr, dlock.ErrNotAcquired):
		t.Logf("lock survived the leader change")
	case lk.Err() != nil && errors.Is(lk.Err(), dlock.ErrLockLost):
		t.Logf("lock reported lost across the leader change: %v", lk.Err())
	case lk.Err() == nil && tryErr == nil:
		t.Fatal("SILENT LOSS: another client took the key while the holder believes it holds it")
	default:
		t.Fatalf("holder err %v, other's try %v", lk.Err(), tryErr)
	}
}

func TestInteropWithConcurrencyMutex(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)

	// etcd's Mutex holds → dlock cannot.
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := concurrency.NewMutex(s, key)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = l.TryAcquire(ctx, key)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("dlock TryAcquire while a Mutex holds: %v", err)
	}
	// dlock waits for the Mutex's release.
	got := make(chan *dlock.Lock, 1)
	go func() {
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	time.Sleep(100 * time.Millisecond)
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	// dlock holds → the Mutex cannot, and its Lock waits for dlock.
	m2 := concurrency.NewMutex(s, key)
	if err := m2.TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("Mutex.TryLock while dlock holds: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- m2.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Mutex.Lock returned while dlock holds: %v", err)
	default:
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m2.Unlock(ctx)
	// The key layout is etcd's: "<key>/<lease hex>".
	lk, err = l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || len(infos[0].Holders) != 1 || infos[0].Holders[0].Token != lk.Token() || infos[0].Holders[0].Owner != lk.Owner() {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	resp, err := cli.Get(ctx, key+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 || string(resp.Kvs[0].Key) != key+"/"+strconv.FormatInt(resp.Kvs[0].Lease, 16) {
		t.Fatalf("layout: %v %v", resp.Kvs, err)
	}
	if resp.Kvs[0].CreateRevision != int64(lk.Token()) {
		t.Fatalf("token %d is not the create revision %d", lk.Token(), resp.Kvs[0].CreateRevision)
	}
}

func TestSameClientTwoLocksExclude(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	l := etcdlock.New(newClient(t, c.Endpoints()))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	a, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("second lock through the same Locker: %v", err)
	}
	got := make(chan *dlock.Lock, 1)
	go func() {
		b, err := l.Acquire(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("second Acquire through the same Locker did not wait")
	default:
	}
	a.Release(ctx)
	b := <-got
	if b == nil || b.Token() <= a.Token() {
		t.Fatalf("second lock %v", b)
	}
	b.Release(ctx)
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

// A waiter whose lease expired while it waited (a renewal a loaded
// machine sent late, or an operator's revoke) failed its Acquire instead
// of queueing again.
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

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := dlocktest.Context(t)
	if _, err := etcdlock.New(nil).Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil client: %v", err)
	}
	if err := etcdlock.NewGuard(nil).Put(ctx, "r", dlock.Fence{Token: 1}, "k", "v"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil guard client: %v", err)
	}
	// Nothing listens there: an error within the context deadline.
	dead := newClient(t, []string{"127.0.0.1:" + strconv.Itoa(testserver.FreePort(t))})
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := etcdlock.New(dead).Acquire(dctx, "k")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unreachable etcd: %v", err)
	}
	t.Logf("unreachable etcd: %v after %v", err, time.Since(start).Round(time.Millisecond))
}

// Without a deadline of its own, an Acquire against an unreachable cluster
// still ends, with an error, after the request timeout.
func TestUnreachableWithoutDeadline(t *testing.T) {
	t.Parallel()
	dead := newClient(t, []string{"127.0.0.1:" + strconv.Itoa(testserver.FreePort(t))})
	_, err := etcdlock.New(dead, etcdlock.WithRequestTimeout(time.Second)).Acquire(context.Background(), "k")
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("unreachable etcd: %v", err)
	}
}
