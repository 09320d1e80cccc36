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
	suite(t, srv, redis.Options{Password: srv.Password(), ReadTimeout: readTimeout}, opts...)
}

// conformanceAs runs the dlocktest suite through default Lockers on
// default clients of srv that log in as user.
func conformanceAs(t *testing.T, srv *testserver.Redis, user, password string) {
	suite(t, srv, redis.Options{Username: user, Password: password})
}

// suite runs the dlocktest suite through Lockers on srv configured by
// opts, on clients with co's options (but Addr).
func suite(t *testing.T, srv *testserver.Redis, co redis.Options, opts ...redislock.Option) {
	admin := newClient(t, srv)
	client := func(t testing.TB, addr string) *redis.Client {
		o := co
		o.Addr = addr
		c := redis.NewClient(&o)
		t.Cleanup(func() { c.Close() })
		return c
	}
	proxied := func(t testing.TB) (dlock.Locker, *testserver.Proxy) {
		p := testserver.StartProxy(t, srv.Addr())
		return redislock.New(client(t, p.Addr()), opts...), p
	}
	dlocktest.TestLocker(t, dlocktest.Harness{
		TTL: conformanceTTL,
		// A break publishes a notice; holders check their keys at once.
		TellsBroken: true,
		New: func(t testing.TB) dlock.Locker {
			return redislock.New(client(t, srv.Addr()), opts...)
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

// The conformance suite, fault section included, on a server with Tair's
// CAS and CAD whose user may run no script (+@all -@scripting): the
// default Locker finds the scripts refused and speaks the Lua-free
// protocol.
func TestConformanceTair(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	srv.AddNoScriptsUser(t)
	conformanceAs(t, srv, testserver.NoScriptsUser, testserver.NoScriptsPassword)
}
