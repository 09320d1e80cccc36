package redislock_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The Sentinel tests run redislock on a default go-redis failover client
// (redis.NewFailoverClient with only the master name, the sentinels and the
// passwords set), against a real primary, two replicas and three
// redis-sentinel processes (internal/testserver.StartSentinel).

// failoverOptions are the options a user of s would write: the master name,
// the sentinels' addresses and the passwords, nothing else.
func failoverOptions(s *testserver.Sentinel) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:       s.Master(),
		SentinelAddrs:    s.Addrs(),
		Password:         s.Servers[0].Password(),
		SentinelPassword: s.Sentinels[0].Password(),
	}
}

// newFailoverClient is a failover client built from opt, closed at cleanup.
func newFailoverClient(t testing.TB, opt *redis.FailoverOptions) *redis.Client {
	c := redis.NewFailoverClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// sentinelClient is a default failover client on s.
func sentinelClient(t testing.TB, s *testserver.Sentinel) *redis.Client {
	return newFailoverClient(t, failoverOptions(s))
}

// viaProxy makes the failover client's connections to the data server at
// target go through p (test plumbing: the client still discovers the master
// through the sentinels; only the dial to that address is redirected).
// Connections to the sentinels are not redirected.
func viaProxy(opt *redis.FailoverOptions, target string, p *testserver.Proxy) {
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == target {
			addr = p.Addr()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// conformanceDownAfter is the sentinels' down-after for the conformance
// topology: the suite's Pause (SIGSTOP of the primary) lasts a few seconds
// at most on a healthy machine and HangTimeout (30s) at worst; a failover
// in the middle of it would turn a paused server into a new primary
// without the keys, which is not what the Pause tests are about (failover
// is tested on its own).
const conformanceDownAfter = 2 * dlocktest.HangTimeout

func TestSentinelConformance(t *testing.T) {
	s := testserver.StartSentinel(t, testserver.WithDownAfter(conformanceDownAfter))
	primary := s.Primary()
	admin := newClient(t, primary)
	dlocktest.TestLocker(t, dlocktest.Harness{
		New: func(t testing.TB) dlock.Locker { return redislock.New(sentinelClient(t, s)) },
		Expire: func(t testing.TB, key string) {
			if err := admin.Del(context.Background(), redislock.New(admin).LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Faults: &dlocktest.Faults{
			// A default failover client whose connections to the primary
			// go through a fault proxy.
			New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
				p := testserver.StartProxy(t, primary.Addr())
				opt := failoverOptions(s)
				viaProxy(opt, primary.Addr(), p)
				return redislock.New(newFailoverClient(t, opt)), p
			},
			// SIGSTOP of the primary, shorter than conformanceDownAfter:
			// the sentinels keep it as the primary.
			Pause: func(t testing.TB, keys ...string) func() {
				primary.Pause()
				return primary.Resume
			},
		},
	})
	if p := s.Primary(); p != primary {
		t.Fatalf("the sentinels failed over to %s during the suite: its Pause tests did not test a paused primary", p.Addr())
	}
}

// The same, with passwords on the data servers and on the sentinels (a
// shorter run: the locking semantics do not depend on them; reaching the
// master through authenticated sentinels does).
func TestSentinelWithPasswords(t *testing.T) {
	s := testserver.StartSentinel(t, testserver.WithReplicas(1),
		testserver.WithDataPassword("data-pw-1"), testserver.WithSentinelPassword("sentinel-pw-1"))
	ctx := dlocktest.Context(t)
	l1, l2 := redislock.New(sentinelClient(t, s)), redislock.New(sentinelClient(t, s))
	key := dlocktest.Key(t)
	lk, err := l1.Acquire(ctx, key, dlock.WithMetadata("job", "sentinel"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l2.TryAcquire(ctx, key)
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) || len(na.Holders) != 1 || na.Holders[0].Owner != lk.Owner() {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	infos, err := l2.List(ctx, "dlocktest.")
	if err != nil || len(infos) != 1 || infos[0].Key != key || infos[0].Holders[0].Metadata["job"] != "sentinel" {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk2, err := l2.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after %d", lk2.Token(), lk.Token())
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The lease is on the primary the sentinels name, and replicated.
	if v, err := s.Primary().Do("EXISTS", l1.LockKey(key)); err != nil || v != "1" {
		t.Fatalf("release marker on the primary: %q %v", v, err)
	}
}
