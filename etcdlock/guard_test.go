package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	g := etcdlock.NewGuard(cli)
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	a := dlock.Fence{Token: 5, Owner: "a"}
	if err := g.Put(ctx, res, a, "data/"+res, "1"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, res, a, "data/"+res, "2"); err != nil {
		t.Fatalf("same owner, same token: %v", err)
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 5, Owner: "b"}, "data/"+res, "x"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("same token, other owner: %v", err)
	}
	b := dlock.Fence{Token: 9, Owner: "b"}
	if v, ok, err := g.Get(ctx, res, b, "data/"+res); err != nil || !ok || v != "2" {
		t.Fatalf("fenced read: %q %v %v", v, ok, err)
	}
	if err := g.Put(ctx, res, a, "data/"+res, "late"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("write after a newer fenced read: %v", err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != b {
		t.Fatalf("Highest = %+v %v", hi, err)
	}
	// Concurrent fenced increments with increasing tokens never interleave.
	res = dlocktest.Key(t) // a fresh resource: lock tokens are revisions
	l := etcdlock.New(cli)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				err := dlock.Do(ctx, l, res, func(ctx context.Context, lk *dlock.Lock) error {
					v, _, err := g.Get(ctx, res, lk.Fence(), "n/"+res)
					if err != nil {
						return err
					}
					n := len(v)
					return g.Put(ctx, res, lk.Fence(), "n/"+res, strings.Repeat("x", n+1))
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if v, _, _ := g.Get(ctx, res, dlock.Fence{Token: 1 << 62, Owner: "z"}, "n/"+res); len(v) != 20 {
		t.Fatalf("fenced counter = %d, want 20", len(v))
	}
}

// The guard suite: every Guard on its own client of one embedded server,
// and second instances (another process) on yet another client.
// Not parallel: the suite checks with goleak that its tests leave no
// goroutine behind, so it runs alone, before the parallel tests start.
func TestGuardSuite(t *testing.T) {
	c := etcdtest.Start(t, 1)
	eps := c.Endpoints()
	guardtest.Run(t,
		func(t *testing.T, opts ...driver.Option) guard.Guard {
			return etcdlock.NewGuard(newClient(t, eps), opts...)
		},
		guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
			return etcdlock.NewGuard(newClient(t, eps), opts...)
		}),
		guardtest.Stallable(func(t *testing.T) (guard.Guard, func()) {
			u, err := url.Parse(c.Members[0].ClientURL)
			if err != nil {
				t.Fatal(err)
			}
			p := testserver.StartProxy(t, u.Host)
			cli := newClient(t, []string{"http://" + p.Addr()})
			t.Cleanup(p.Heal) // before the client closes, which would wait on the stalled link
			return etcdlock.NewGuard(cli), p.Stall
		}))
}

// Txn runs arbitrary operations under the fence: Responses[0] is the
// fence key's, the operations' results follow; a shared fence is admitted
// without being recorded; a refusal runs nothing and is reported once.
func TestGuardTxn(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	var (
		mu     sync.Mutex
		events []dlock.Event
	)
	obs := dlock.ObserverFunc(func(e dlock.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	g := etcdlock.NewGuard(cli, etcdlock.WithGuardPrefix("/fences/"), dlock.WithObserver(obs))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	data := "/data/" + res
	if got, want := g.FenceKey(res), "/fences/"+res; got != want {
		t.Fatalf("FenceKey = %q, want %q", got, want)
	}
	a := dlock.Fence{Token: 5, Owner: "a"}
	resp, err := g.Txn(ctx, res, a, clientv3.OpPut(data, "1"), clientv3.OpGet(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Responses) != 3 || resp.Responses[0].GetResponsePut() == nil {
		t.Fatalf("Txn responses %v: want the fence's put and the two operations'", resp.Responses)
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) != 1 || string(kvs[0].Value) != "1" {
		t.Fatalf("Txn's read = %v", kvs)
	}
	// The same fence again is not written again: the fence key is read.
	resp, err = g.Txn(ctx, res, a, clientv3.OpGet(data))
	if err != nil {
		t.Fatal(err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) != 1 || string(kvs[0].Value) != "5|a" {
		t.Fatalf("Txn with the recorded fence: fence response %v", resp.Responses[0])
	}
	// A shared fence at or above the highest is admitted; it raises the
	// highest token seen, not the exclusive fence.
	s := dlock.Fence{Token: 7, Owner: "s", Shared: true}
	if _, err := g.Txn(ctx, res, s, clientv3.OpPut(data, "2")); err != nil {
		t.Fatalf("shared fence: %v", err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != a {
		t.Fatalf("Highest after a shared fence = %+v, %v; want %+v", hi, err, a)
	}
	// A stale fence runs nothing, returns the refusal and reports it.
	old := dlock.Fence{Token: 4, Owner: "o"}
	_, err = g.Txn(ctx, res, old, clientv3.OpPut(data, "stale"))
	var st *dlock.StaleTokenError
	if !errors.As(err, &st) || st.Resource != res || st.Token != 4 || st.Highest != 7 {
		t.Fatalf("stale Txn = %v", err)
	}
	if g, err := cli.Get(ctx, data); err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "2" {
		t.Fatalf("data after a refused Txn: %v, %v", g, err)
	}
	mu.Lock()
	got := append([]dlock.Event(nil), events...)
	mu.Unlock()
	want := dlock.Event{Kind: dlock.EventRejected, Backend: "etcd", Key: res, Mode: dlock.Exclusive, Token: 4, Owner: "o", Highest: 7}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("events %+v, want [%+v]", got, want)
	}
}

// Named values live under FenceKey(res)+NUL+name: no resource/name pair
// shares a key with another, nor with a fence, and a fence key that holds
// something else is an error, not a reset of the resource's fences.
func TestGuardKeys(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	g := etcdlock.NewGuard(cli)
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	f := dlock.Fence{Token: 3, Owner: "a"}
	if err := g.Put(ctx, res, f, "n", "v"); err != nil {
		t.Fatal(err)
	}
	if got, want := g.ValueKey(res, "n"), etcdlock.DefaultGuardPrefix+res+"\x00n"; got != want {
		t.Fatalf("ValueKey = %q, want %q", got, want)
	}
	kv, err := cli.Get(ctx, g.ValueKey(res, "n"))
	if err != nil || len(kv.Kvs) != 1 || string(kv.Kvs[0].Value) != "v" {
		t.Fatalf("value key: %v, %v", kv, err)
	}
	// "res/x" + "n" and "res" + "x/n" are different pairs.
	if err := g.Put(ctx, res+"/x", f, "n", "1"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, res, f, "x/n", "2"); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := g.Get(ctx, res+"/x", f, "n"); err != nil || !ok || v != "1" {
		t.Fatalf("Get(res/x, n) = %q, %v, %v", v, ok, err)
	}
	if _, err := cli.Put(ctx, g.FenceKey(res), "garbage"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 1, Owner: "z"}, "n", "x"); err == nil || errors.Is(err, dlock.ErrStaleToken) || !strings.Contains(err.Error(), "not a fence") {
		t.Fatalf("Put over a corrupt fence key = %v, want an error naming it", err)
	}
	if _, err := g.Highest(ctx, res); err == nil {
		t.Fatal("Highest of a corrupt fence key: no error")
	}
}

// The zero Guard (declared as a value, or a literal that forgot NewGuard)
// fails every call with ErrNilClient, as a nil client does, like the zero
// Locker.
// Symptom: every method of the zero Guard panicked on its nil client.
func TestGuard_ZeroValueFailsWithErrNilClient(t *testing.T) {
	t.Parallel()
	var g etcdlock.Guard
	ctx := context.Background()
	f := dlock.Fence{Token: 1, Owner: "o"}
	for name, fn := range map[string]func() error{
		"Put":     func() error { return g.Put(ctx, "r", f, "n", "v") },
		"Get":     func() error { _, _, err := g.Get(ctx, "r", f, "n"); return err },
		"Txn":     func() error { _, err := g.Txn(ctx, "r", f); return err },
		"Highest": func() error { _, err := g.Highest(ctx, "r"); return err },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s on the zero Guard panicked: %v", name, r)
				}
			}()
			if err := fn(); !errors.Is(err, dlock.ErrNilClient) {
				t.Errorf("%s on the zero Guard = %v, want ErrNilClient", name, err)
			}
		}()
	}
}

// A default Guard's keys lie in no lock's queue directory (the default
// lock prefix is empty): locks named "dlock", "dlock%guard" and
// "dlock%25guard" are free next to them, and List shows none of them.
// Symptom: a default Guard's fence keys in the queue of the lock named "dlock", blocking it.
func TestGuard_DefaultPrefixOutsideLockQueues(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	ctx := dlocktest.Context(t)
	client := newClient(t, c.Endpoints())
	g := etcdlock.NewGuard(client)
	if err := g.Put(ctx, "r", dlock.Fence{Token: 7, Owner: "o"}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	l := etcdlock.New(client)
	for _, key := range []string{"dlock", "dlock%guard", "dlock%25guard"} {
		lk, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("lock %q with a default Guard's keys present: %v", key, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 0 {
		t.Fatalf("List shows the guard's keys as locks: %+v", infos)
	}
}

// Every Guard call returns by its context's deadline on a stalled link
// (clientv3 puts the context's deadline on the gRPC call).
// Symptom: a Guard call on a stalled link returning only after some other timeout, past its context's deadline.
func TestGuard_ReturnsByDeadline_StalledLink(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	u, err := url.Parse(c.Members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	p := testserver.StartProxy(t, u.Host)
	g := etcdlock.NewGuard(newClient(t, []string{"http://" + p.Addr()}), etcdlock.WithGuardPrefix("/guard/"))
	t.Cleanup(p.Heal)
	f := dlock.Fence{Token: 5, Owner: "me"}
	if err := g.Put(dlocktest.Context(t), "res", f, "/data/x", "1"); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	const (
		budget = 200 * time.Millisecond
		slack  = 2 * time.Second // generous: only a wait for some other timeout fails
	)
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Txn", func(ctx context.Context) error {
			_, err := g.Txn(ctx, "res", f, clientv3.OpPut("/data/x", "2"))
			return err
		}},
		{"Put", func(ctx context.Context) error { return g.Put(ctx, "res", f, "/data/x", "2") }},
		{"Get", func(ctx context.Context) error { _, _, err := g.Get(ctx, "res", f, "/data/x"); return err }},
		{"Highest", func(ctx context.Context) error { _, err := g.Highest(ctx, "res"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		start := time.Now()
		err := tc.fn(ctx)
		took := time.Since(start)
		cancel()
		if took > budget+slack {
			t.Errorf("Guard.%s with a %v context on a stalled link returned after %v", tc.name, budget, took.Round(time.Millisecond))
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Guard.%s on a stalled link = %v, want an error wrapping context.DeadlineExceeded", tc.name, err)
		}
	}
}
