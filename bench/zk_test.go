package bench

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// zkSession is the session timeout both ZooKeeper clients ask for (zklock
// derives its lease from it: two thirds).
const zkSession = 30 * time.Second

// quiet drops go-zookeeper's log lines.
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// zkPeerPrefix is where go-zookeeper's zk.Lock puts its locks (zklock's
// are under zklock.DefaultPrefix).
const zkPeerPrefix = "/bench-zk"

// zkConnect connects to addr with zklock.Connect, which zklock needs to
// know the session timeout the server granted.
func zkConnect(b *testing.B, addr string) *zk.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := zklock.Connect(ctx, []string{addr}, zkSession, zklock.WithLogger(quiet{}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

// zkPeerConnect connects to addr the way a go-zookeeper program does
// (zk.Connect) and waits, at most 20s, for the session.
func zkPeerConnect(b *testing.B, addr string) *zk.Conn {
	c, _, err := zk.Connect([]string{addr}, zkSession, zk.WithLogger(quiet{}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	for deadline := time.Now().Add(20 * time.Second); c.State() != zk.StateHasSession; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("zookeeper %s: no session after 20s", addr)
		}
	}
	return c
}

// zkReceived is the number of packets the server has received ("srvr"),
// to count the requests a lock operation sends.
func zkReceived(b *testing.B, srv *testserver.ZooKeeper) int64 {
	out, err := srv.FourLetter("srvr")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Received: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("srvr: no Received line in %q", out)
	return 0
}

// zkOp is one uncontended acquire+release on key.
type zkOp func(ctx context.Context, key string) error

// benchZK measures op on key() and reports the requests the server
// received per operation (zkreqs/op; the client's pings are a few per
// minute).
func benchZK(b *testing.B, srv *testserver.ZooKeeper, key func() string, op zkOp) {
	ctx := context.Background()
	before := zkReceived(b, srv)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		if err := op(ctx, key()); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.StopTimer()
	b.ReportMetric(float64(zkReceived(b, srv)-before-1)/float64(n), "zkreqs/op") // -1: the srvr command itself
}

// BenchmarkZooKeeper is dlock's zklock against go-zookeeper's own lock
// recipe (zk.NewLock, Lock, Unlock) on one standalone ZooKeeper server,
// uncontended acquire+release from one goroutine:
//
//   - distinct-keys: a new key each time (as the other backends' benches):
//     each recipe creates the key's znode first.
//   - one-key: the same key again and again: zk.Lock's key znode stays
//     (persistent), zklock's is a container that its release deletes.
//
// rtt is one exists request, a read; the writes (create, delete, multi)
// the recipes are mostly made of cost more, as they pass the server's
// transaction log.
func BenchmarkZooKeeper(b *testing.B) {
	srv := testserver.StartZooKeeper(b)
	dconn, pconn := zkConnect(b, srv.Addr()), zkPeerConnect(b, srv.Addr())
	l := zklock.New(dconn)
	acl := zk.WorldACL(zk.PermAll)
	if _, err := pconn.Create(zkPeerPrefix, nil, 0, acl); err != nil && err != zk.ErrNodeExists {
		b.Fatal(err)
	}
	dlockOp := func(ctx context.Context, key string) error {
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			return err
		}
		return lk.Release(ctx)
	}
	peerOp := func(_ context.Context, key string) error {
		m := zk.NewLock(pconn, zkPeerPrefix+"/"+key, acl)
		if err := m.Lock(); err != nil {
			return err
		}
		return m.Unlock()
	}
	// Warm the server's JIT and both clients before measuring either.
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		if err := dlockOp(ctx, benchKey()); err != nil {
			b.Fatal(err)
		}
		if err := peerOp(ctx, benchKey()); err != nil {
			b.Fatal(err)
		}
	}
	one := benchKey()
	same := func() string { return one }
	b.Run("rtt", func(b *testing.B) {
		benchZK(b, srv, same, func(context.Context, string) error {
			_, _, err := dconn.Exists("/")
			return err
		})
	})
	b.Run("distinct-keys", func(b *testing.B) {
		b.Run("zklock", func(b *testing.B) { benchZK(b, srv, benchKey, dlockOp) })
		b.Run("zk.Lock", func(b *testing.B) { benchZK(b, srv, benchKey, peerOp) })
	})
	b.Run("one-key", func(b *testing.B) {
		b.Run("zklock", func(b *testing.B) { benchZK(b, srv, same, dlockOp) })
		b.Run("zk.Lock", func(b *testing.B) { benchZK(b, srv, same, peerOp) })
	})
}
