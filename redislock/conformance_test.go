package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, testserver.StartRedis(t), 0)
}

// conformanceTTL is the suite's short lease (Harness.TTL) on every Redis
// deployment: 4 times the suite's default (500ms), so that a holder
// starved of CPU for a moment (the tests of four modules run at once on
// two cores, under the race detector) still renews in time: a renewal is
// due every TTL/3, and a lock is lost when none answered within the TTL.
const conformanceTTL = 2 * time.Second

// conformance runs the dlocktest suite through Lockers on srv configured
// by opts, on clients whose ReadTimeout is readTimeout (0: go-redis's
// default).
func conformance(t *testing.T, srv *testserver.Redis, readTimeout time.Duration, opts ...redislock.Option) {
	admin := newClient(t, srv)
	proxied := func(t testing.TB) (dlock.Locker, *testserver.Proxy) {
		p := testserver.StartProxy(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), Password: srv.Password(), ReadTimeout: readTimeout})
		t.Cleanup(func() { c.Close() })
		return redislock.New(c, opts...), p
	}
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL: conformanceTTL,
		// A break publishes a notice; holders check their keys at once.
		TellsBroken: true,
		New: func(t testing.TB) dlock.Locker {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password(), ReadTimeout: readTimeout})
			t.Cleanup(func() { c.Close() })
			return redislock.New(c, opts...)
		},
		Expire: func(t testing.TB, key string) {
			if err := admin.Del(context.Background(), redislock.New(admin).LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Faults: &dlocktest.Faults{
			// A client (default, but for readTimeout) whose every
			// connection goes through a fault proxy.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				return proxied(t)
			},
			// The same, the proxy stopped by down.
			Down: func(t testing.TB) (dlock.Locker, func()) {
				l, p := proxied(t)
				return l, p.Stop
			},
			Pause: func(t testing.TB, keys ...string) func() {
				srv.Pause()
				return srv.Resume
			},
		},
	})
}
