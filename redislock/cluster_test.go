package redislock_test

import (
	"context"
	"net"
	"strconv"
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

// testCluster is a three-master Redis Cluster for the tests.
type testCluster struct {
	nodes []*testserver.Redis
	addrs []string
	admin *redis.ClusterClient
}

// startCluster starts a three-master cluster whose failure detection is
// slower than any pause a test makes (SIGSTOP of a master), so that the
// healthy masters keep serving their slots meanwhile.
func startCluster(t *testing.T) *testCluster {
	tc := &testCluster{nodes: testserver.StartRedisCluster(t, 3)}
	for _, n := range tc.nodes {
		tc.addrs = append(tc.addrs, n.Addr())
		for _, kv := range [][2]string{{"cluster-node-timeout", "120000"}, {"cluster-require-full-coverage", "no"}} {
			if _, err := n.Do("CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatalf("config set %s on %s: %v", kv[0], n.Addr(), err)
			}
		}
	}
	tc.admin = tc.client(t, nil)
	return tc
}

// client returns a default ClusterClient; via maps a node address (as the
// cluster announces it) to the address to dial instead (a fault proxy).
func (tc *testCluster) client(t testing.TB, via map[string]string) *redis.ClusterClient {
	opt := &redis.ClusterOptions{Addrs: tc.addrs}
	if via != nil {
		// Test wiring only: every connection to a node goes through its
		// proxy. The client's timeouts and retries stay the defaults.
		opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if p, ok := via[addr]; ok {
				addr = p
			}
			d := net.Dialer{Timeout: 5 * time.Second}
			return d.DialContext(ctx, network, addr)
		}
	}
	c := redis.NewClusterClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// proxied returns a Locker on a default ClusterClient that reaches every
// node through a fault proxy of its own, and the proxies.
func (tc *testCluster) proxied(t testing.TB) (*redislock.Locker, testserver.Proxies) {
	var link testserver.Proxies
	via := map[string]string{}
	for _, n := range tc.nodes {
		p := testserver.StartProxy(t, n.Addr())
		link = append(link, p)
		via[n.Addr()] = p.Addr()
	}
	return redislock.New(tc.client(t, via)), link
}

// master returns the node owning key's lock.
func (tc *testCluster) master(t testing.TB, key string) *testserver.Redis {
	m, err := tc.admin.MasterForKey(context.Background(), redislock.New(tc.admin).LockKey(key))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range tc.nodes {
		if n.Addr() == m.Options().Addr {
			return n
		}
	}
	t.Fatalf("no node at %s", m.Options().Addr)
	return nil
}

// TestCluster runs the conformance suite on a three-master Redis Cluster:
// lock and counter keys share a slot (hash tag), renewals of locks on
// different masters are pipelined per master, List scans every master,
// and a Guard's keys of one resource share a slot.
func TestCluster(t *testing.T) {
	t.Parallel()
	tc := startCluster(t)
	t.Run("Conformance", func(t *testing.T) {
		dlocktest.TestLocker(t, dlocktest.Harness{
			TTL: conformanceTTL,
			New: func(t testing.TB) dlock.Locker { return redislock.New(tc.client(t, nil)) },
			Expire: func(t testing.TB, key string) {
				if err := tc.admin.Del(context.Background(), redislock.New(tc.admin).LockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			},
			Faults: &dlocktest.Faults{
				// A proxy in front of every master.
				New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
					return tc.proxied(t)
				},
				// The same, every proxy stopped by down.
				Down: func(t testing.TB) (dlock.Locker, func()) {
					l, link := tc.proxied(t)
					return l, func() {
						for _, p := range link {
							p.Stop()
						}
					}
				},
				// The masters owning the keys, alone: the others keep
				// serving (HungMasterDelaysOnlyItsLocks checks their locks
				// survive).
				Pause: func(t testing.TB, keys ...string) func() {
					paused := map[*testserver.Redis]bool{}
					for _, k := range keys {
						if n := tc.master(t, k); !paused[n] {
							paused[n] = true
							n.Pause()
						}
					}
					return func() {
						for n := range paused {
							n.Resume()
						}
					}
				},
			},
		})
	})
	t.Run("ListAcrossMasters", func(t *testing.T) {
		l := redislock.New(tc.client(t, nil))
		ctx := dlocktest.Context(t)
		held := map[string]bool{}
		for i := 0; i < 12; i++ { // keys spread over the three masters
			key := dlocktest.Key(t)
			if i%4 == 0 {
				key = "}" + key // an encoded hash tag
			}
			lk, err := l.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			held[key] = true
		}
		infos, err := l.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			delete(held, in.Key)
		}
		if len(held) != 0 {
			t.Fatalf("List missed %d held keys: %v", len(held), held)
		}
	})
	t.Run("HungMasterDelaysOnlyItsLocks", func(t *testing.T) { testHungMaster(t, tc) })
}

// TestClusterGuardSuite runs the guard suite on a Cluster: every script of
// a resource names its fence key and a data key, so a data key outside
// the fence key's slot fails with CROSSSLOT. Not parallel: the suite
// looks for goroutines leaked while it runs, in the whole process.
func TestClusterGuardSuite(t *testing.T) {
	tc := startCluster(t)
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard {
		return redislock.NewGuard(tc.client(t, nil), opts...)
	}
	guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
		return newGuard(t, opts...)
	}))
}

// One master hangs (SIGSTOP): the lock on it is lost (before anyone else
// can take it), while a lock on a healthy master, renewed by the same
// watchdog in the same batches, stays renewed: renewals sent after the
// master hung, and after the lock on it was lost, succeed.
func testHungMaster(t *testing.T, tc *testCluster) {
	// A TTL a starved process still renews in time.
	const ttl = 3 * time.Second
	l := redislock.New(tc.client(t, nil))
	key := dlocktest.Key(t)
	hung := tc.master(t, key)
	other := ""
	for i := 0; i < 1000 && other == ""; i++ {
		if k := key + "." + strconv.Itoa(i); tc.master(t, k) != hung {
			other = k
		}
	}
	if other == "" {
		t.Fatal("no key on another master in 1000 tries")
	}
	onHung, err := l.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	healthy, err := l.Acquire(dlocktest.Context(t), other, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer healthy.Release(context.Background())
	hung.Pause()
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			hung.Resume()
		}
	}()
	renewedAfter(t, healthy, paused)
	select {
	case <-onHung.Lost():
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the lock on the paused master was not lost")
	}
	renewedAfter(t, healthy, time.Now())
	t.Logf("after %v with a master paused: the lock on it lost, the other renewed", time.Since(paused).Round(time.Millisecond))
	hung.Resume()
	resumed = true
	// Nobody could take the lost lock before its Lost() closed.
	lk := dlocktest.AcquireWhenFree(t, redislock.New(tc.client(t, nil)), key, onHung)
	lk.Release(context.Background())
	if err := healthy.Refresh(dlocktest.Context(t)); err != nil {
		t.Fatalf("healthy lock: %v", err)
	}
}
