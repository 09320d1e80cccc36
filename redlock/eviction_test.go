package redlock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// evict makes srv evict keys under memory pressure (policy).
func evict(t *testing.T, srv *testserver.Redis, policy string) {
	t.Helper()
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", policy}} {
		if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
}

// Guards against a quorum counting nodes whose leases the server may
// evict under memory pressure.
func TestAcquire_RefusesEvictingNode(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	for _, s := range c.srvs {
		evict(t, s, "volatile-lru")
	}
	ctx := dlocktest.Context(t)
	_, err := c.locker(t).TryAcquire(ctx, dlocktest.Key(t))
	var ee *redlock.EvictionError
	if !errors.As(err, &ee) || !errors.Is(err, dlock.ErrUnsupported) || ee.Policy != "volatile-lru" {
		t.Fatalf("got %v; want an *EvictionError naming volatile-lru", err)
	}
	lk, err := c.locker(t, redlock.WithUnsafeEviction()).TryAcquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatalf("WithUnsafeEviction: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Guards against an evicting minority node slipping through because an
// attempt waits for a majority of answers only: once it has answered,
// every attempt is refused.
func TestAcquire_RefusesEvictingMinorityNodeOnceAnswered(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	evict(t, c.srvs[1], "allkeys-lfu")
	// A node timeout no loaded machine runs out: the evicting node's
	// answer must come in, not be given up on.
	l := c.locker(t, redlock.WithNodeTimeout(dlocktest.HangTimeout))
	ctx := dlocktest.Context(t)
	if lk, err := l.TryAcquire(ctx, dlocktest.Key(t)); err == nil {
		_ = lk.Release(ctx) // the evicting node answered after the majority
	}
	if !background.Wait(dlocktest.HangTimeout) { // every node has answered
		t.Fatal("hang: background work did not end")
	}
	_, err := l.TryAcquire(ctx, dlocktest.Key(t))
	var ee *redlock.EvictionError
	if !errors.As(err, &ee) || ee.Policy != "allkeys-lfu" {
		t.Fatalf("got %v; want an *EvictionError naming allkeys-lfu", err)
	}
}

// Guards against a node that is down at first use holding up every
// attempt with its eviction check, or failing them: the others' quorum
// decides.
func TestAcquire_EvictionCheckSkipsDownNode(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	l := c.locker(t)
	c.srvs[2].Stop()
	ctx := dlocktest.Context(t)
	for range 2 {
		lk, err := l.TryAcquire(ctx, dlocktest.Key(t))
		if err != nil {
			t.Fatalf("TryAcquire with one node down: %v", err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
