package redislock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestSentinelGuardSuite runs the guard conformance suite on default
// failover clients: each Guard has a client of its own, and the second
// instance (guardtest.Shared) is another failover client on the same
// group, as another process would open it.
func TestSentinelGuardSuite(t *testing.T) {
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter))
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard {
		return redislock.NewGuard(sentinelClient(t, s), opts...)
	}
	guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
		return newGuard(t, opts...)
	}))
}

// A lock taken through Sentinel fences writes made through Sentinel: the
// guard's state lives on the primary the sentinels name, and a stale
// holder's write is refused there, whichever client sends it.
func TestSentinelGuardFencesLocks(t *testing.T) {
	t.Parallel()
	s := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithDownAfter(conformanceDownAfter),
		testserver.WithDataPassword("guard-data-pw"), testserver.WithSentinelPassword("guard-sentinel-pw"))
	ctx := dlocktest.Context(t)
	c1, c2 := sentinelClient(t, s), sentinelClient(t, s)
	l1, l2 := redislock.New(c1), redislock.New(c2)
	g1, g2 := redislock.NewGuard(c1), redislock.NewGuard(c2)
	key := dlocktest.Key(t)
	first, err := l1.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Put(ctx, key, first.Fence(), "v", "first"); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := l2.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(context.Background())
	if err := g2.Put(ctx, key, second.Fence(), "v", "second"); err != nil {
		t.Fatal(err)
	}
	var st *dlock.StaleTokenError
	if err := g1.Put(ctx, key, first.Fence(), "v", "late"); !errors.Is(err, dlock.ErrStaleToken) || !errors.As(err, &st) || st.Highest != second.Token() {
		t.Fatalf("the first holder's late write: %v", err)
	}
	if v, ok, err := g1.Get(ctx, key, second.Fence(), "v"); err != nil || !ok || v != "second" {
		t.Fatalf("Get = %q, %v, %v", v, ok, err)
	}
	if v, err := s.Primary().Do("GET", g1.Key(key, "v")); err != nil || v != "second" {
		t.Fatalf("the value on the primary the sentinels name: %q %v", v, err)
	}
}
