package etcdlock_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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

// queueLen returns the number of entries in key's queue.
func queueLen(t testing.TB, cli *clientv3.Client, l *etcdlock.Locker, key string) int {
	t.Helper()
	resp, err := cli.Get(dlocktest.Context(t), l.QueuePrefix(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// awaitQueueLen waits (bounded) until key's queue has n entries: the
// waiters started have put theirs.
func awaitQueueLen(t testing.TB, cli *clientv3.Client, l *etcdlock.Locker, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for queueLen(t, cli, l, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q never had %d entries (has %d)", key, n, queueLen(t, cli, l, key))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// acquired is the outcome of a background Acquire.
type acquired struct {
	lk  *dlock.Lock
	err error
}

// acquireBG starts a blocking Acquire bounded by dlocktest.Context (or
// ctx, if not nil) and returns its outcome's channel.
func acquireBG(t testing.TB, ctx context.Context, l dlock.Locker, key string, opts ...dlock.Option) <-chan acquired {
	if ctx == nil {
		ctx = dlocktest.Context(t)
	}
	ch := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, opts...)
		ch <- acquired{lk, err}
	}()
	return ch
}

// got waits (bounded) for a background Acquire and fails unless it got
// the lock.
func got(t testing.TB, ch <-chan acquired, what string) *dlock.Lock {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		t.Cleanup(func() { _ = a.lk.Release(context.Background()) })
		return a.lk
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("%s: hang", what)
	}
	return nil
}

// pending fails if a background Acquire has returned.
func pending(t testing.TB, ch <-chan acquired, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s returned (%v, %v) while it should wait", what, a.lk, a.err)
	default:
	}
}

func rel(t testing.TB, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
}
