package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A lock's TTL is the lease etcd applied: whole seconds, rounded up, and
// at least the server's minimum; the local deadline counts from it.
func TestEffectiveTTL(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	admin := newClient(t, c.Endpoints())
	// The time each lease grant or keep-alive is sent: each TTL below
	// takes a lease of its own, and the lock counts from no later than the
	// last of them. (An attempt that reuses its lease after a failed one,
	// as a starved process's first attempt is, renews it with a
	// keep-alive first, and counts from that.)
	var (
		mu   sync.Mutex
		sent time.Time
	)
	stamp := func() {
		mu.Lock()
		sent = time.Now()
		mu.Unlock()
	}
	grants := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.Lease/LeaseGrant" {
			stamp()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	keepAlives := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return s, err
		}
		return stampedStream{s, stamp}, nil
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, DialOptions: []grpc.DialOption{grants, keepAlives}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	l := etcdlock.New(cli)
	for _, ttl := range []time.Duration{300 * time.Millisecond, 2500 * time.Millisecond, time.Minute} {
		key := dlocktest.Key(t)
		lk, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		// Read at once: a renewal sent from here on would move sent past
		// the send the lock counts from.
		mu.Lock()
		start := sent
		mu.Unlock()
		deadline := lk.Deadline()
		resp, err := admin.TimeToLive(dlocktest.Context(t), leaseOf(t, admin, l, key))
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Duration(resp.GrantedTTL) * time.Second
		if lk.TTL() != granted || granted < ttl || granted%time.Second != 0 {
			t.Errorf("WithTTL(%v): lock TTL %v, lease granted %v: want the lease's, whole seconds, at least the TTL asked for", ttl, lk.TTL(), granted)
		}
		if !deadline.Before(start.Add(granted)) {
			t.Errorf("WithTTL(%v): deadline %v after the lease grant was sent, beyond the lease's %v", ttl, deadline.Sub(start), granted)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// stampedStream calls stamp before each message it sends.
type stampedStream struct {
	grpc.ClientStream
	stamp func()
}

func (s stampedStream) SendMsg(m any) error {
	s.stamp()
	return s.ClientStream.SendMsg(m)
}

// New passes its whole option list to the core: dlock.WithObserver sees
// the etcd backend's events.
func TestObserver(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	var (
		mu     sync.Mutex
		events []dlock.Event
	)
	obs := dlock.ObserverFunc(func(e dlock.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	l := etcdlock.New(newClient(t, c.Endpoints()), etcdlock.WithPrefix("observed/"), dlock.WithObserver(obs))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.QueuePrefix(key); got != "observed/"+key+"/" {
		t.Fatalf("QueuePrefix = %q: WithPrefix was not applied", got)
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	kinds := map[dlock.EventKind]int{}
	for _, e := range events {
		if e.Backend != "etcd" || e.Key != key {
			t.Errorf("event %+v: want Backend etcd and Key %q", e, key)
		}
		kinds[e.Kind]++
	}
	if kinds[dlock.EventAcquire] != 1 || kinds[dlock.EventRelease] != 1 {
		t.Fatalf("events %+v: want one acquire and one release", events)
	}
}

// Bad input to New is reported by every call, never a panic: a nil client
// (dlock.ErrNilClient), a negative request timeout (dlock.ErrInvalidOption).
func TestNewBadInput(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	ctx := dlocktest.Context(t)
	for _, tc := range []struct {
		name string
		l    *etcdlock.Locker
		want error
	}{
		{"nil client", etcdlock.New(nil), dlock.ErrNilClient},
		{"negative request timeout", etcdlock.New(cli, etcdlock.WithRequestTimeout(-time.Second)), dlock.ErrInvalidOption},
	} {
		if _, err := tc.l.Acquire(ctx, "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: Acquire = %v, want %v", tc.name, err, tc.want)
		}
		if _, err := tc.l.TryAcquire(ctx, "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: TryAcquire = %v, want %v", tc.name, err, tc.want)
		}
		if _, err := tc.l.List(ctx, ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: List = %v, want %v", tc.name, err, tc.want)
		}
	}
	// Zero is the default timeout, and nil options are skipped.
	lk, err := etcdlock.New(cli, etcdlock.WithRequestTimeout(0), nil).TryAcquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(context.Background())
	// Shared and counted locks are offered; a bad limit is refused.
	sh, err := etcdlock.New(cli).TryAcquire(ctx, dlocktest.Key(t), dlock.WithShared())
	if err != nil {
		t.Fatalf("WithShared = %v", err)
	}
	sh.Release(context.Background())
	for _, n := range []int{0, -1, dlock.MaxLimit + 1} {
		if _, err := etcdlock.New(cli).TryAcquire(ctx, dlocktest.Key(t), dlock.WithLimit(n)); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("WithLimit(%d) = %v, want ErrInvalidOption", n, err)
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

// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic.
// Symptom: Guard.Put and Guard.Highest panicked on a nil context.
func TestNilContext_IsInvalidOptionEverywhere(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cl := newClient(t, c.Endpoints())
	l := etcdlock.New(cl)
	g := etcdlock.NewGuard(cl, etcdlock.WithGuardPrefix("/guard/"))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	f := lk.Fence()
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Txn", func() error { _, err := g.Txn(nilCtx, "r", f, clientv3.OpPut("/data/k", "v")); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "r", f, "/data/k", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "r", f, "/data/k"); return err }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "r"); return err }},
		{"nil-client Guard.Put", func() error {
			return etcdlock.NewGuard(nil, etcdlock.WithGuardPrefix("/guard/")).Put(nilCtx, "r", f, "/data/k", "v")
		}},
	} {
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("PANIC: %v", r)
				}
			}()
			return tc.fn()
		}()
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", tc.name, err)
		}
	}
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*etcdlock.Locker)(nil))
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	c := etcdtest.Start(t, 1)
	dlocktest.TestRefusesForeignOption(t, etcdlock.New(newClient(t, c.Endpoints()), dlocktest.ForeignOption()))
}
