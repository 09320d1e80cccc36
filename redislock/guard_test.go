package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestGuardSuite runs the conformance suite of every guard. Each Guard has
// a client of its own; the second instance (guardtest.Shared) is another
// client on the same server, as another process would open it.
func TestGuardSuite(t *testing.T) {
	srv := testserver.StartRedis(t)
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard {
		return redislock.NewGuard(newClient(t, srv), opts...)
	}
	guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
		return newGuard(t, opts...)
	}), guardtest.Stallable(func(t *testing.T) (guard.Guard, func()) {
		p := testserver.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password()})
		t.Cleanup(func() { c.Close() })
		t.Cleanup(p.Heal) // before the client closes
		return redislock.NewGuard(c), p.Stall
	}))
}

func TestGuardRules(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	a := dlock.Fence{Token: 10, Owner: "a"}
	if err := g.Put(ctx, res, a, "v", "1"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, res, a, "v", "2"); err != nil { // same token, same owner
		t.Fatalf("same owner, same token: %v", err)
	}
	var st *dlock.StaleTokenError
	err := g.Put(ctx, res, dlock.Fence{Token: 10, Owner: "b"}, "v", "x")
	if !errors.Is(err, dlock.ErrStaleToken) || !errors.As(err, &st) || st.Highest != 10 {
		t.Fatalf("same token, other owner: %v", err)
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 9, Owner: "a"}, "v", "x"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("older token: %v", err)
	}
	// A fenced read by a newer holder shuts out the older one's write.
	b := dlock.Fence{Token: 1 << 60, Owner: "b"} // large: compared exactly
	if v, ok, err := g.Get(ctx, res, b, "v"); err != nil || !ok || v != "2" {
		t.Fatalf("fenced read = %q, %v, %v", v, ok, err)
	}
	if err := g.Put(ctx, res, a, "v", "late"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("write after newer read: %v", err)
	}
	if n, err := g.IncrBy(ctx, res, b, "n", 5); err != nil || n != 5 {
		t.Fatalf("IncrBy = %d, %v", n, err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != b {
		t.Fatalf("Highest = %+v, %v", hi, err)
	}
	if _, err := g.Eval(ctx, res, dlock.Fence{}, "return 1", nil); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("zero fence: %v", err)
	}
	if _, _, err := redislock.NewGuard(nil).Get(ctx, res, b, "v"); !errors.Is(err, dlock.ErrNilClient) {
		t.Fatalf("nil client: %v", err)
	}
}

// TestGuardRejectsPausedHolder plays the GC-pause story: the first holder
// stalls past its lease, a second holder takes the lock and writes, and the
// first one's late write is refused.
func TestGuardRejectsPausedHolder(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	l, g := redislock.New(c), redislock.NewGuard(c)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	first, err := l.Acquire(ctx, key, dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	<-first.Lost() // "paused": never renewed
	second, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if err := g.Put(ctx, key, second.Fence(), "balance", "100"); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, key, first.Fence(), "balance", "0"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("late write by the paused holder: %v", err)
	}
	if v, _ := c.Get(ctx, g.Key(key, "balance")).Result(); v != "100" {
		t.Fatalf("balance = %q", v)
	}
}

// TestGuardFencedIncrements: 8 holders in turn increment a counter through
// the guard; every increment is admitted exactly once.
func TestGuardFencedIncrements(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	key := dlocktest.Key(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := redislock.New(newClient(t, srv))
			for j := 0; j < 5; j++ {
				err := dlock.Do(dlocktest.Context(t), l, key, func(ctx context.Context, lk *dlock.Lock) error {
					_, err := g.IncrBy(ctx, key, lk.Fence(), "n", 1)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	v, ok, err := g.Get(dlocktest.Context(t), key, dlock.Fence{Token: 1<<63 + 1, Owner: "reader"}, "n")
	if err != nil || !ok || v != "40" {
		t.Fatalf("counter = %q, %v, %v", v, ok, err)
	}
}

// Key(res, "") is the guard's seen key: a body given it could delete the
// record of a reader's token and let a paused writer in. Eval refuses the
// guard's own keys.
func TestGuardEval_RefusesTheGuardsOwnKeys(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	g := redislock.NewGuard(newClient(t, srv))
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	if err := g.Put(ctx, res, dlock.Fence{Token: 9, Owner: "r", Shared: true}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{g.Key(res, ""), g.FenceKey(res)} {
		_, err := g.Eval(ctx, res, dlock.Fence{Token: 9, Owner: "r", Shared: true}, `return redis.call('DEL', KEYS[1])`, []string{k})
		if !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Eval deleting %q = %v, want ErrInvalidOption", k, err)
		}
	}
	if err := g.Put(ctx, res, dlock.Fence{Token: 5, Owner: "w"}, "n", "stale"); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("the paused writer after the reader = %v, want refused", err)
	}
}
