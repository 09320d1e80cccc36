package zklock_test

// Red-team tests for zklock (hostile review). Each test proved one defect
// (the comment above it says what broke, in the past state of the code)
// and is kept as its regression test: it passes now. They run against
// real ZooKeeper servers on loopback.

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// rewriter is a TCP proxy in front of a ZooKeeper server that, while
// clamp is set, lowers the session timeout a client asks for in its
// connect request: it makes the server behave like an ensemble member
// configured with maxSessionTimeout = clamp (a rolling configuration
// change, or one member configured differently from the others).
type rewriter struct {
	t      testing.TB
	target string
	ln     net.Listener
	clamp  atomic.Int32 // ms; 0: pass through
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startRewriter(t testing.TB, target string) *rewriter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rewriter{t: t, target: target, ln: ln}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.stop)
	return r
}

func (r *rewriter) Addr() string { return r.ln.Addr().String() }

func (r *rewriter) stop() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *rewriter) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, c)
	return true
}

func (r *rewriter) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		r.track(c)
		r.track(s)
		r.wg.Add(2)
		go func() { // server -> client, as is
			defer r.wg.Done()
			io.Copy(c, s)
			c.Close()
			s.Close()
		}()
		go func() { // client -> server, rewriting the connect request
			defer r.wg.Done()
			defer c.Close()
			defer s.Close()
			// [len][protocolVersion int32][lastZxidSeen int64][timeOut int32]...
			var head [20]byte
			if _, err := io.ReadFull(c, head[:]); err != nil {
				return
			}
			if cl := r.clamp.Load(); cl > 0 && int32(binary.BigEndian.Uint32(head[16:20])) > cl {
				binary.BigEndian.PutUint32(head[16:20], uint32(cl))
			}
			if _, err := s.Write(head[:]); err != nil {
				return
			}
			io.Copy(s, c)
		}()
	}
}

// The session timeout is lowered by the server at a reconnect (a member
// with a lower maxSessionTimeout, emulated by the rewriter). zklock's
// sniffer records the new timeout at once, but a held lock keeps its old
// lease and local deadline until its next renewal checks it. If the link
// stalls right after the reconnect, that renewal never answers: the
// server expires the session after the new, shorter timeout, another
// client gets the key, and the holder's Lost() is still open.
//
// Promise broken: "Lost() closes before the session can expire on the
// server ... so before another client can be granted the key" (doc.go).
func TestRedSessionTimeoutLoweredAtReconnect(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	rw := startRewriter(t, z.Addr())
	p := testserver.StartProxy(t, rw.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, 30*time.Second)
	l := zklock.New(c)
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(context.Background())
	if lk.TTL() != 20*time.Second {
		t.Fatalf("TTL %v, want 20s (2/3 of a 30s session)", lk.TTL())
	}
	// The connection drops and the client reconnects to a server that
	// grants at most 1s.
	rw.clamp.Store(1000)
	p.Cut()
	p.Heal()
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		if d, _ := zklock.SessionTimeout(c); d == time.Second {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the client did not reconnect with the lowered session timeout")
		}
		time.Sleep(time.Millisecond)
	}
	// The reconnect went through on the same session (the lock is held),
	// and now the link stalls.
	p.Stall()
	// Fixed: the reconnect that lowered the timeout lost the lock at once
	// (its lease no longer fits the session); what must hold either way
	// is the ordering below.
	t.Logf("after the reconnect: Err() = %v", lk.Err())
	other := zklock.New(connect(t, []string{z.Addr()}))
	lk2 := dlocktest.AcquireWhenFree(t, other, key, lk)
	lk2.Release(context.Background())
}

// Connect's context ends while the server hangs (accepts, never answers
// the handshake). Connect returns, but the connection it dialled stays
// open, with go-zookeeper's goroutine blocked reading the handshake reply
// for 10 x 2/3 of the session timeout (200s for a 30s session): zklock
// wraps the dialler, so it holds the net.Conn, but it does not close it.
// Every failed Connect against a hung ensemble leaks a socket and a
// goroutine for minutes.
//
// Promise broken: nothing is left behind / every blocking call returns by
// its context (the work it started does not stop).
func TestRedConnectLeavesConnToHungServer(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var conns []net.Conn
	defer func() {
		for _, c := range conns { // ends go-zookeeper's blocked read
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = zklock.Connect(ctx, []string{hung.Addr().String()}, 30*time.Second, zklock.WithLogger(quiet{}))
	cancel()
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Connect to a hung server: %v, want ErrUnavailable", err)
	}
	returned := time.Now()
	var sc net.Conn
	select {
	case sc = <-accepted:
		conns = append(conns, sc)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the client never connected")
	}
	// Read what the client sent (its connect request) until it closes
	// the connection.
	sc.SetReadDeadline(returned.Add(15 * time.Second))
	_, err = io.Copy(io.Discard, sc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("leak: Connect returned (%v) but the connection it opened to the hung server was still open 15s later", err)
	}
}

// Path on the zero Locker and FencePath on the zero Guard dereference a
// nil backend. The zero Guard is documented to fail every call with
// ErrNilClient (guard.go), and etcdlock's equivalent (QueuePrefix on the
// zero Locker) was a red-team finding fixed there.
//
// Promise broken: bad input gives a clear error, never a panic.
func TestRedZeroValuesPanic(t *testing.T) {
	for name, fn := range map[string]func() string{
		"Locker{}.Path":     func() string { var l zklock.Locker; return l.Path("k") },
		"Guard{}.FencePath": func() string { var g zklock.Guard; return g.FencePath("r") },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", name, r)
				}
			}()
			t.Logf("%s = %q", name, fn())
		}()
	}
}

// A Guard.Put whose value is 1 MiB (the guard.Guard contract: "values are
// any bytes"; the zklock Guard documents no limit) is sent as is. The
// server refuses a packet above its jute.maxbuffer (1 MiB) by closing the
// connection: Put returns "zk: connection closed" (an unknown outcome,
// not a clear refusal), and the connection of every lock, waiter and
// guard sharing the *zk.Conn drops. With a short session the client
// cannot reconnect within a lock's lease, so a lock held on the same
// connection is lost because of another call's bad input.
//
// Promise broken: bad input gives a clear error (and does not break other
// users of the connection).
func TestRedGuardHugeValueDropsConnection(t *testing.T) {
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
