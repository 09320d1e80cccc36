package redlock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// Guards against a quorum counting a node whose leases the server may
// evict under memory pressure.
func TestAcquire_RefusesEvictingNode(t *testing.T) {
	t.Parallel()
	c := startNodes(t, 3)
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "volatile-lru"}} {
		if _, err := c.srvs[1].Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
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
