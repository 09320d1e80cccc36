package redislock_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// New's option list reaches both redislock (WithPrefix) and the core
// (dlock.WithObserver, nil options skipped).
func TestOptions(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv)
	var rec dlocktest.Recorder
	l := redislock.New(c, nil, redislock.WithPrefix("opts"), dlock.WithObserver(&rec), nil)
	key := dlocktest.Key(t)
	if lk := l.LockKey(key); !strings.HasPrefix(lk, "opts:{") {
		t.Fatalf("LockKey = %q, want the prefix opts", lk)
	}
	ctx := dlocktest.Context(t)
	lk, err := l.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, l.LockKey(key)).Result(); err != nil || !strings.HasPrefix(v, lk.Owner()+"|") {
		t.Fatalf("%s = %q, %v; want the lease", l.LockKey(key), v, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []dlock.EventKind{dlock.EventAcquire, dlock.EventRelease} {
		if e, ok := rec.Last(kind); !ok || e.Backend != "redis" {
			t.Errorf("observer: event %v with backend %q (seen %v), want backend redis", kind, e.Backend, ok)
		}
	}
	if got := redislock.New(c, redislock.WithPrefix("")).LockKey(key); !strings.HasPrefix(got, redislock.DefaultPrefix+":{") {
		t.Errorf("WithPrefix(\"\"): LockKey = %q, want the default prefix", got)
	}
	// Shared and limited locks live under the prefix too.
	for name, opt := range map[string]dlock.Option{"shared": dlock.WithShared(), "limited": dlock.WithLimit(2)} {
		lk, err := l.TryAcquire(ctx, key, opt)
		if err != nil {
			t.Fatalf("TryAcquire %s: %v", name, err)
		}
		if v, err := c.Get(ctx, l.LockKey(key)).Result(); err != nil || !strings.HasPrefix(v, "*") {
			t.Errorf("%s: %s = %q, %v; want the group", name, l.LockKey(key), v, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
