package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

func TestBadInput(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("s3cret"))
	ctx := dlocktest.Context(t)
	// nil clients, plain and typed.
	for _, l := range []*redislock.Locker{redislock.New(nil), redislock.New((*redis.Client)(nil)), redislock.New((*redis.ClusterClient)(nil))} {
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client Acquire: %v", err)
		}
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client TryAcquire: %v", err)
		}
		if _, err := l.List(ctx, ""); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("nil client List: %v", err)
		}
	}
	// Wrong password.
	bad := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "wrong"})
	defer bad.Close()
	_, err := redislock.New(bad).Acquire(ctx, "k")
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("wrong password: %v", err)
	}
	// Unreachable server: an error, not a hang, within the context.
	unreach := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t)), MaxRetries: 1})
	defer unreach.Close()
	start := time.Now()
	_, err = redislock.New(unreach).Acquire(ctx, "k")
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("unreachable: %v", err)
	}
	t.Logf("unreachable server: %v after %v", err, time.Since(start).Round(time.Millisecond))
	// Right password works.
	good := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "s3cret"})
	defer good.Close()
	lk, err := redislock.New(good).Acquire(ctx, "k", dlock.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(ctx)
}

// callNil runs fn, turning a panic into an error that says so, and fails
// the test if fn does not return in time.
func callNil(t *testing.T, name string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("PANIC: %v", r)
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(dlocktest.HangTimeout):
		t.Fatalf("%s(nil ctx) still blocked after %v", name, dlocktest.HangTimeout)
		return nil
	}
}

// Symptom: List and the Guard methods panicked on a nil context.
// Every entry point taking a context reports a nil one as an error
// wrapping dlock.ErrInvalidOption, never a panic or a hang.
func TestEntryPoints_NilContext_InvalidOption(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	l := redislock.New(newClient(t, srv))
	g := redislock.NewGuard(newClient(t, srv))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	var nilCtx context.Context
	f := lk.Fence()
	for _, c := range []struct {
		name string
		fn   func() error
	}{
		{"Locker.Acquire", func() error { _, err := l.Acquire(nilCtx, key+"x"); return err }},
		{"Locker.TryAcquire", func() error { _, err := l.TryAcquire(nilCtx, key+"x"); return err }},
		{"Locker.List", func() error { _, err := l.List(nilCtx, ""); return err }},
		{"Lock.Refresh", func() error { return lk.Refresh(nilCtx) }},
		{"Guard.Eval", func() error { _, err := g.Eval(nilCtx, "res", f, "return 1", nil); return err }},
		{"Guard.Put", func() error { return g.Put(nilCtx, "res", f, "n", "v") }},
		{"Guard.Get", func() error { _, _, err := g.Get(nilCtx, "res", f, "n"); return err }},
		{"Guard.IncrBy", func() error { _, err := g.IncrBy(nilCtx, "res", f, "c", 1); return err }},
		{"Guard.Highest", func() error { _, err := g.Highest(nilCtx, "res"); return err }},
		{"nil-client Guard.Put", func() error { return redislock.NewGuard(nil).Put(nilCtx, "res", f, "n", "v") }},
		{"dlock.Do", func() error {
			return dlock.Do(nilCtx, l, key+"y", func(context.Context, *dlock.Lock) error { return nil })
		}},
	} {
		if err := callNil(t, c.name, c.fn); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s(nil ctx) = %v, want an error wrapping dlock.ErrInvalidOption", c.name, err)
		}
	}
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*redislock.Locker)(nil))
	if k := (*redislock.Locker)(nil).LockKey("k"); k != "" {
		t.Errorf("nil Locker's LockKey = %q, want \"\"", k)
	}
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	srv := testserver.StartRedis(t)
	dlocktest.TestRefusesForeignOption(t, redislock.New(newClient(t, srv), dlocktest.ForeignOption()))
}
