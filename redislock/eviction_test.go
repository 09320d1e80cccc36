package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// evictingServer starts a server of its own whose maxmemory is set and
// whose policy evicts any key under memory pressure.
func evictingServer(t *testing.T) *testserver.Redis {
	t.Helper()
	srv := testserver.StartRedis(t)
	for _, kv := range [][2]string{{"maxmemory", "100mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if _, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

// Guards against handing out locks whose keys the server may evict while
// they are held.
func TestAcquire_RefusesEvictingServer(t *testing.T) {
	t.Parallel()
	srv := evictingServer(t)
	c := newClient(t, srv)
	l := redislock.New(c)
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	for _, acquire := range []func(context.Context, string, ...dlock.Option) (*dlock.Lock, error){l.TryAcquire, l.Acquire} {
		lk, err := acquire(ctx, key, dlock.WithTTL(dlock.MinTTL))
		var ee *redislock.EvictionError
		if !errors.As(err, &ee) || !errors.Is(err, dlock.ErrUnsupported) {
			if lk != nil {
				_ = lk.Release(ctx)
			}
			t.Fatalf("got %v, %v; want an *EvictionError wrapping ErrUnsupported", lk, err)
		}
		if ee.Policy != "allkeys-lru" || ee.MaxMemory != 100<<20 {
			t.Fatalf("EvictionError %+v: want allkeys-lru, %d", ee, 100<<20)
		}
		for _, hint := range []string{"noeviction", "WithUnsafeEviction"} {
			if !strings.Contains(err.Error(), hint) {
				t.Fatalf("error %q does not say how to fix it (%s)", err, hint)
			}
		}
	}
	if n, err := c.Exists(ctx, l.LockKey(key)).Result(); err != nil || n != 0 {
		t.Fatalf("lock key exists after a refusal: %d, %v", n, err)
	}
}

// Guards against volatile-* policies passing the check: lock keys carry a
// TTL, so those policies evict them too.
func TestAcquire_RefusesVolatilePolicy(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithArgs("--maxmemory", "50mb", "--maxmemory-policy", "volatile-ttl"))
	_, err := redislock.New(newClient(t, srv)).TryAcquire(dlocktest.Context(t), dlocktest.Key(t))
	var ee *redislock.EvictionError
	if !errors.As(err, &ee) || ee.Policy != "volatile-ttl" {
		t.Fatalf("got %v; want an *EvictionError naming volatile-ttl", err)
	}
}

// Guards against an ACL that denies CONFIG hiding an evicting server: the
// check falls back to INFO memory.
func TestAcquire_RefusesEvictingServer_ConfigDenied(t *testing.T) {
	t.Parallel()
	srv := evictingServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "app", "on", ">apppw", "~*", "&*", "+@all", "-config"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "apppw"})
	t.Cleanup(func() { c.Close() })
	ctx := dlocktest.Context(t)
	if err := c.ConfigGet(ctx, "maxmemory").Err(); err == nil {
		t.Fatal("CONFIG GET allowed: the ACL did not take")
	}
	_, err := redislock.New(c).TryAcquire(ctx, dlocktest.Key(t))
	var ee *redislock.EvictionError
	if !errors.As(err, &ee) || ee.Policy != "allkeys-lru" {
		t.Fatalf("got %v; want an *EvictionError read from INFO", err)
	}
}

// Guards against WithUnsafeEviction being ignored.
func TestAcquire_UnsafeEvictionOptionAllows(t *testing.T) {
	t.Parallel()
	srv := evictingServer(t)
	l := redislock.New(newClient(t, srv), redislock.WithUnsafeEviction())
	ctx := dlocktest.Context(t)
	lk, err := l.TryAcquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := redislock.NewGuard(newClient(t, srv), redislock.WithUnsafeEviction())
	if err := g.Put(ctx, dlocktest.Key(t), lk.Fence(), "v", "1"); err != nil {
		t.Fatal(err)
	}
}

// Guards against refusing the default server (no maxmemory, noeviction)
// or asking it on every call: the check runs once per Locker.
func TestAcquire_AcceptsNonEvictingServer_AskedOnce(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	if _, err := srv.Do("CONFIG", "SET", "maxmemory-policy", "noeviction"); err != nil {
		t.Fatal(err)
	}
	// A limit with noeviction is safe too: writes fail, keys stay.
	limited := testserver.StartRedis(t, testserver.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", "noeviction"))
	for _, s := range []*testserver.Redis{srv, limited} {
		c := newClient(t, s)
		if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		l := redislock.New(c)
		ctx := dlocktest.Context(t)
		for range 3 {
			lk, err := l.TryAcquire(ctx, dlocktest.Key(t))
			if err != nil {
				t.Fatalf("%s: %v", s.Addr(), err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		stats, err := s.Do("INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		calls, _ := redisCalls(stats, "cmdstat_config|get")
		if calls != "1" {
			t.Fatalf("%s: CONFIG GET ran %s times for 3 acquisitions, want 1:\n%s", s.Addr(), calls, stats)
		}
	}
}

// redisCalls returns the calls= field of a commandstats line.
func redisCalls(info, cmd string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+":"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					return v, true
				}
			}
		}
	}
	return "", false
}

// Guards against the fence record living on a server that may evict it:
// an evicted record admits fences it had refused.
func TestGuard_RefusesEvictingServer(t *testing.T) {
	t.Parallel()
	srv := evictingServer(t)
	c := newClient(t, srv)
	g := redislock.NewGuard(c)
	ctx := dlocktest.Context(t)
	res := dlocktest.Key(t)
	f := dlock.Fence{Token: 5, Owner: "a"}
	checks := map[string]func() error{
		"Put":     func() error { return g.Put(ctx, res, f, "v", "1") },
		"Get":     func() error { _, _, err := g.Get(ctx, res, f, "v"); return err },
		"IncrBy":  func() error { _, err := g.IncrBy(ctx, res, f, "n", 1); return err },
		"Eval":    func() error { _, err := g.Eval(ctx, res, f, "return 1", nil); return err },
		"Highest": func() error { _, err := g.Highest(ctx, res); return err },
	}
	for name, call := range checks {
		err := call()
		var ee *redislock.EvictionError
		if !errors.As(err, &ee) || !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("%s: got %v; want an *EvictionError", name, err)
		}
	}
	if n, err := c.Exists(ctx, g.FenceKey(res)).Result(); err != nil || n != 0 {
		t.Fatalf("fence key written after a refusal: %d, %v", n, err)
	}
}
