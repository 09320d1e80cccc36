package zklock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// The guard suite on a standalone server and on an ensemble (each guard
// instance on its own connection, the ensemble's through any member). Not
// parallel: the suite checks that its goroutines end (goleak), so it runs
// apart from tests that start goroutines of their own.
func TestGuard(t *testing.T) {
	z := sharedZooKeeper(t)
	guardtest.Run(t, func(t *testing.T, opts ...driver.Option) guard.Guard {
		return zklock.NewGuard(connect(t, []string{z.Addr()}), opts...)
	}, guardtest.Stallable(func(t *testing.T) (guard.Guard, func()) {
		p := testserver.StartProxy(t, z.Addr())
		c := connect(t, []string{p.Addr()})
		t.Cleanup(p.Heal) // before the connection closes, which would wait on the stalled link
		return zklock.NewGuard(c), p.Stall
	}))
}

func TestGuardEnsemble(t *testing.T) {
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	addrs := testserver.ZooKeeperAddrs(nodes)
	guardtest.Run(t, func(t *testing.T, opts ...driver.Option) guard.Guard {
		return zklock.NewGuard(connect(t, addrs), opts...)
	})
}

func TestGuardBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := dlock.Fence{Token: 1, Owner: "o"}
	for name, g := range map[string]*zklock.Guard{
		"nil conn":   zklock.NewGuard(nil),
		"zero guard": {},
	} {
		if err := g.Put(ctx, "r", f, "n", "v"); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("%s: Put = %v, want ErrNilClient", name, err)
		}
	}
	z := sharedZooKeeper(t)
	c := connect(t, []string{z.Addr()})
	for _, p := range []string{"/", "rel", "/a//b", "/a/"} {
		if _, err := zklock.NewGuard(c, zklock.WithGuardPrefix(p)).Highest(ctx, "r"); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("prefix %q: %v, want ErrInvalidOption", p, err)
		}
	}
	// A fence znode that does not hold a fence is an error, not a reset.
	g := zklock.NewGuard(c, zklock.WithGuardPrefix(uniquePrefix(t)))
	if err := g.Put(ctx, "junk", f, "n", "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(g.FencePath("junk"), []byte("garbage"), -1); err != nil {
		t.Fatal(err)
	}
	if err := g.Put(ctx, "junk", dlock.Fence{Token: 9}, "n", "v"); err == nil {
		t.Fatal("Put over a garbage fence znode succeeded")
	}
}

// A Put whose value fits MaxValueLen but whose whole request (a long
// prefix, paths, fence) does not is refused with ErrInvalidOption; the
// connection, and an unrelated lock held on it, stay.
// Symptom: such a Put was sent, ZooKeeper dropped the connection and the lock held on it was lost.
func TestGuardPut_RefusesRequestOverPacketLimit(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	c := connect(t, []string{z.Addr()})
	ctx := dlocktest.Context(t)
	held, err := zklock.New(c).Acquire(ctx, dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	prefix := uniquePrefix(t) + "/" + strings.Repeat("p", 40<<10)
	g := zklock.NewGuard(c, zklock.WithGuardPrefix(prefix))
	err = g.Put(ctx, "r", dlock.Fence{Token: 1, Owner: "o"}, "n", strings.Repeat("v", zklock.MaxValueLen))
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Put of a MaxValueLen value under a 40 KiB prefix = %v, want ErrInvalidOption", err)
	}
	// The connection, and the lock on it, are still there.
	if err := g.Put(ctx, "r", dlock.Fence{Token: 1, Owner: "o"}, "n", "small"); err != nil {
		t.Fatalf("a small Put on the same connection: %v", err)
	}
	select {
	case <-held.Lost():
		t.Fatalf("the lock held on the guard's connection was lost: %v", held.Err())
	default:
	}
}

// A Guard.Put of a 1 MiB value fails with a clear error, not "zk:
// connection closed", and a lock held on the same connection is kept. The
// server refuses a packet above its jute.maxbuffer (1 MiB) by closing the
// connection, which would drop every lock, waiter and guard sharing the
// *zk.Conn; so bad input gives a clear error and does not break other
// users of the connection.
// Symptom: the 1 MiB Put was sent, the server dropped the connection and a lock held on it was lost.
func TestGuardPut_HugeValueKeepsConnectionAndLock(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	c := connect(t, []string{z.Addr()})
	lk, err := zklock.New(c).Acquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	g := zklock.NewGuard(c)
	f := dlock.Fence{Token: lk.Token(), Owner: lk.Owner()}
	err = g.Put(dlocktest.Context(t), "r", f, "n", strings.Repeat("x", 1<<20))
	t.Logf("Put of a 1 MiB value: %v", err)
	waitSession(t, c)
	switch {
	case lk.Err() != nil:
		t.Fatalf("a Guard.Put of a 1 MiB value (error %q) dropped the connection and the lock held on it was lost: %v", err, lk.Err())
	case errors.Is(err, zk.ErrConnectionClosed):
		t.Fatalf("a Guard.Put of a 1 MiB value failed with %q (an unknown outcome after a dropped connection), not a clear refusal", err)
	}
}
