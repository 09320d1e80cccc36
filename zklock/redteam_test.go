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
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
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
	z := testserver.StartZooKeeper(t)
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

// waitSession waits until c has a session again (after a heal).
func waitSession(t testing.TB, c *zk.Conn) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for c.State() != zk.StateHasSession {
		if time.Now().After(end) {
			t.Fatalf("hang: no session within %v", dlocktest.HangTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The reply to a TryAcquire's create is lost (the create took effect), and
// the servers stay unreachable for a while (about ten seconds). The
// recovery lists the key's children to find the node by its owner id, but
// every listing fails with zk.ErrNoServer, which call() maps to
// ErrTransient; after 10 tries findRetrying returns that transient error.
// The engine takes ErrTransient to mean "nothing was left behind" and
// does not Abort the attempt. When the servers come back, the session is
// still alive (its timeout is longer than the outage), so the node stays:
// the key is held by an attempt that returned an error, for as long as the
// client keeps its session (its pings keep it alive for ever). A later
// Acquire by the same client even queues behind its own zombie.
//
// Promise broken: "An attempt abandoned mid-request (lost reply, context
// ended) leaves no node behind: it is found by its owner id and deleted"
// (doc.go), and nothing is left behind on the server.
func TestRedLostCreateReplyThenOutageLeavesZombie(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	// The key's znode exists, so that the attempt's first request is the
	// create.
	if _, err := admin.Create(zklock.DefaultPrefix, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	if _, err := admin.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply()
	type res struct {
		lk  *dlock.Lock
		err error
	}
	done := make(chan res, 1)
	go func() {
		lk, err := l.TryAcquire(dlocktest.Context(t), key)
		done <- res{lk, err}
	}()
	// The create took effect (its reply is being dropped): the servers
	// now become unreachable.
	waitFor(t, "the create took effect", func() bool { return len(children(t, admin, dir)) == 1 })
	p.Cut()
	var r res
	select {
	case r = <-done:
	case <-time.After(dlocktest.HangTimeout + 10*time.Second):
		t.Fatal("hang: TryAcquire did not return")
	}
	if r.err == nil {
		r.lk.Release(context.Background())
		t.Fatal("TryAcquire succeeded through an outage")
	}
	t.Logf("TryAcquire returned: %v (ErrTransient: %v)", r.err, errors.Is(r.err, dlock.ErrTransient))
	p.Heal()
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x): the test needs it to survive the outage", sid, c.SessionID())
	}
	// Nobody holds the key: the only node is the failed attempt's, and it
	// must go (background deletion or Abort).
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		kids := children(t, admin, dir)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(end) {
			other := zklock.New(connect(t, []string{z.Addr()}))
			_, err := other.TryAcquire(dlocktest.Context(t), key)
			t.Fatalf("zombie: the failed attempt's node %v still holds %q %v after the servers came back (session %x alive); another client's TryAcquire: %v",
				kids, key, dlocktest.HangTimeout, sid, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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

// A server (a wrong port, a proxy, a hostile endpoint) answers the
// connect handshake with a well-formed reply whose session timeout is 0.
// zklock's handshake sniffer reads that reply and deliberately ignores a
// timeout <= 0 (session.go), but lets it through to go-zookeeper, which
// sets its ping interval to 0 and panics in time.NewTicker on its own
// goroutine: the whole program crashes. Connect should refuse the
// handshake with a clear error instead.
//
// Promise broken: "bad input gives a clear error, never a panic".
func TestRedHostileHandshakeCrashesProcess(t *testing.T) {
	if os.Getenv("ZKRED_CHILD") == "handshake" {
		hostileHandshakeChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRedHostileHandshakeCrashesProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ZKRED_CHILD=handshake")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * dlocktest.HangTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("hang: the child process did not end: %s", out)
	}
	if err != nil || strings.Contains(string(out), "panic:") {
		line := string(out)
		if i := strings.Index(line, "panic:"); i >= 0 {
			line = line[i:]
			if j := strings.Index(line, "goroutine "); j > 0 {
				line = line[:j]
			}
		}
		t.Fatalf("Connect to a server whose handshake grants a 0ms session crashed the process (%v): %s", err, strings.TrimSpace(line))
	}
	t.Logf("child: %s", out)
}

func hostileHandshakeChild(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var n [4]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:]))); err != nil {
					return
				}
				// [len][protocolVersion][timeOut = 0][sessionId][passwd]
				reply := make([]byte, 4+4+4+8+4+16)
				binary.BigEndian.PutUint32(reply[0:], uint32(len(reply)-4))
				binary.BigEndian.PutUint32(reply[8:], 0)
				binary.BigEndian.PutUint64(reply[12:], 0x1122334455667788)
				binary.BigEndian.PutUint32(reply[20:], 16)
				c.Write(reply)
				io.Copy(io.Discard, c)
			}()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := zklock.Connect(ctx, []string{ln.Addr().String()}, 10*time.Second, zklock.WithLogger(quiet{}))
	t.Logf("Connect = %v", err)
	if err == nil {
		time.Sleep(2 * time.Second) // the client's goroutines run meanwhile
		c.Close()
	}
}

// A blocking Acquire's create loses its reply, the servers become
// unreachable and the Acquire's context ends during the outage. The engine
// undoes the attempt with one Abort (bounded by DefaultReleaseTimeout),
// which fails too since the outage goes on, and nothing retries it (unlike
// a node zklock abandons itself, whose deletion is retried for two
// minutes). When the servers come back within the session timeout the
// node is still there, first in the queue: the key is held by an attempt
// that ended in an error, for as long as the client keeps its session.
//
// Promise broken: "An attempt abandoned mid-request (lost reply, context
// ended) leaves no node behind" (doc.go).
func TestRedAbortNotRetriedLeavesZombie(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connect(t, []string{z.Addr()})
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	c := connectFor(t, []string{p.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	if _, err := admin.Create(zklock.DefaultPrefix, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	if _, err := admin.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lk, err := l.Acquire(ctx, key)
		if err == nil {
			lk.Release(context.Background())
		}
		done <- err
	}()
	waitFor(t, "the create took effect", func() bool { return len(children(t, admin, dir)) == 1 })
	p.Cut()
	var err error
	select {
	case err = <-done:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Acquire did not return")
	}
	if err == nil {
		t.Fatal("Acquire succeeded through an outage")
	}
	t.Logf("Acquire returned: %v", err)
	// The engine's Abort runs in the background with DefaultReleaseTimeout:
	// keep the servers unreachable a little longer than that.
	time.Sleep(dlock.DefaultReleaseTimeout + 2*time.Second)
	p.Heal()
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x): the test needs it to survive the outage", sid, c.SessionID())
	}
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		kids := children(t, admin, dir)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(end) {
			other := zklock.New(connect(t, []string{z.Addr()}))
			_, err := other.TryAcquire(dlocktest.Context(t), key)
			t.Fatalf("zombie: the failed Acquire's node %v still holds %q %v after the servers came back (session %x alive); another client's TryAcquire: %v",
				kids, key, dlocktest.HangTimeout, sid, err)
		}
		time.Sleep(100 * time.Millisecond)
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

// watchedUnder returns the paths under dir that the server has watches on
// ("wchp").
func watchedUnder(t testing.TB, z *testserver.ZooKeeper, dir string) []string {
	t.Helper()
	out, err := z.FourLetter("wchp")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, dir+"/") {
			paths = append(paths, line)
		}
	}
	return paths
}

// Under churn a waiter's predecessor often vanishes between the listing
// of the queue and the exists-watch set on it. go-zookeeper's ExistsW on
// a missing node still sets a watch, for the node's creation; zklock
// ignores it (acquire.go: "if !w.ok { continue }") and the sequential
// name will never be created again. So every such race leaves a watch on
// the server (and a channel in the client), kept for the whole life of the
// session and re-sent at every reconnect: they accumulate without bound.
//
// Promise broken: nothing is left behind on the server.
func TestRedWatchLeakOnVanishedPredecessor(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	addrs := []string{z.Addr()}
	c := connect(t, addrs)
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	holder, err := zklock.New(connect(t, addrs)).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var attempts atomic.Int64
	for w := range 6 {
		wg.Go(func() {
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				attempts.Add(1)
				var lk *dlock.Lock
				var err error
				if w%2 == 0 {
					lk, err = l.TryAcquire(dlocktest.Context(t), key)
				} else {
					wait := time.Duration(10+rand.IntN(60)) * time.Millisecond
					lk, err = l.Acquire(dlocktest.Context(t), key, dlock.WithWait(wait))
				}
				if err == nil {
					lk.Release(context.Background())
					t.Errorf("acquired a held key")
					return
				}
			}
		})
	}
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Every node of the churn is deleted (background deletions included).
	waitFor(t, "the queue emptied", func() bool { return len(children(t, c, dir)) == 0 })
	time.Sleep(time.Second)
	if w := watchedUnder(t, z, dir); len(w) > 0 {
		ex := w
		if len(ex) > 3 {
			ex = ex[:3]
		}
		t.Fatalf("after %d attempts, every node gone, the server still keeps %d watches on vanished queue nodes of the live session (e.g. %v)", attempts.Load(), len(w), ex)
	}
}

// The server hangs (a GC or disk stall, SIGSTOP here) for a few seconds
// longer than the request timeout while a TryAcquire's create is in
// flight; the session timeout is longer than the stall, so the session
// survives it. The create times out (ErrUnavailable: outcome unknown),
// the engine's single Abort times out as well (it is bounded by
// DefaultReleaseTimeout and waits behind the same hung server), and
// nothing retries it. When the server resumes it processes the create:
// the node appears after everybody gave up on it and holds the key for
// the rest of the session, which the client's pings keep alive.
//
// Promise broken: "An attempt abandoned mid-request (lost reply, context
// ended) leaves no node behind" (doc.go); a hung server must not turn
// into a key held for ever.
func TestRedServerHangDuringCreateLeavesZombie(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	admin := connectFor(t, []string{z.Addr()}, 40*time.Second)
	c := connectFor(t, []string{z.Addr()}, 40*time.Second)
	sid := c.SessionID()
	l := zklock.New(c)
	key := dlocktest.Key(t)
	dir := l.Path(key)
	if _, err := admin.Create(zklock.DefaultPrefix, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	if _, err := admin.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	z.Pause()
	resumed := false
	defer func() {
		if !resumed {
			z.Resume()
		}
	}()
	_, err := l.TryAcquire(dlocktest.Context(t), key)
	if err == nil {
		t.Fatal("TryAcquire succeeded against a hung server")
	}
	t.Logf("TryAcquire against the hung server: %v", err)
	// Let the engine's Abort give up (it started when TryAcquire returned).
	time.Sleep(dlock.DefaultReleaseTimeout + 2*time.Second)
	z.Resume()
	resumed = true
	waitSession(t, c)
	if c.SessionID() != sid {
		t.Fatalf("the session changed (%x -> %x)", sid, c.SessionID())
	}
	// The client's requests are answered in order: once a sync sent now
	// returns, the create queued during the hang has been processed.
	if _, err := c.Sync("/"); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		kids := children(t, admin, dir)
		if len(kids) == 0 {
			return
		}
		if time.Now().After(end) {
			other := zklock.New(connect(t, []string{z.Addr()}))
			_, err := other.TryAcquire(dlocktest.Context(t), key)
			t.Fatalf("zombie: the failed TryAcquire's node %v holds %q %v after the server resumed (session %x alive); another client's TryAcquire: %v",
				kids, key, dlocktest.HangTimeout, sid, err)
		}
		time.Sleep(100 * time.Millisecond)
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
	z := testserver.StartZooKeeper(t)
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

// One member of a healthy 3-node ensemble hangs (SIGSTOP: the kernel still
// accepts TCP connections, nothing answers). go-zookeeper shuffles the
// server list and, when it picks the hung member, waits for its handshake
// reply for 10 x 2/3 of the session timeout before it tries the next one.
// zklock's Connect owns the dialler (it wraps every connection to sniff
// the handshake) but sets no bound of its own on the handshake, so a
// Connect that starts with the hung member fails at its deadline although
// two healthy members (a quorum) were available all along.
//
// Promise broken: Connect "waits, within ctx, until it has a session"; it
// reports the ensemble unavailable when only one member hangs.
func TestRedConnectStuckOnOneHungMember(t *testing.T) {
	nodes := testserver.StartZooKeeperEnsemble(t, 3)
	addrs := testserver.ZooKeeperAddrs(nodes)
	leader := testserver.ZooKeeperLeader(nodes)
	var hung *testserver.ZooKeeper
	for _, z := range nodes {
		if z != leader {
			hung = z
			break
		}
	}
	hung.Pause()
	defer hung.Resume()
	const clients = 16
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := zklock.Connect(ctx, addrs, 3*time.Second, zklock.WithLogger(quiet{}))
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			c.Close()
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d Connects failed against an ensemble with 2 of 3 members healthy (member %s hung): %v", n, clients, hung.Addr(), firstErr.Load())
	}
}

// startHTTPish starts a listener that answers whatever it receives the way
// an HTTP server does (ZooKeeper's own AdminServer on :8080 is one): a
// "400 Bad Request" response, then it closes the connection.
func startHTTPish(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				c.Read(make([]byte, 512))
				io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}()
		}
	}()
	return ln.Addr().String()
}

// The server list holds one wrong address: a port where an HTTP server
// listens (say ZooKeeper's AdminServer). When the client reconnects it
// tries that address; zklock's handshake sniffer takes bytes 8..20 of the
// HTTP response (" 400 Bad Req") for a timeout of 540,291,120 ms and a
// non-zero session id, and records it, although go-zookeeper then rejects
// that handshake and goes back to the real server. An Acquire made in
// that window reads the poisoned timeout: its lock gets a lease of 4 days
// (under dlock.MaxTTL, so the engine accepts it) on a session of 1.5s,
// and is not renewed (so not checked) for 1.4 days. When the holder's
// link stalls, the server expires the session after 1.5s and another
// client takes the key while the holder's Lost() stays open for days.
//
// Promise broken: "Lost() closes before the session can expire on the
// server ... so before another client can be granted the key"; the lease
// is "two thirds of the session timeout the ensemble granted".
func TestRedGarbageServerInListPoisonsLease(t *testing.T) {
	z := testserver.StartZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	bad := startHTTPish(t)
	c := connectFor(t, []string{p.Addr(), bad}, sessionTimeout)
	if d, _ := zklock.SessionTimeout(c); d != sessionTimeout {
		t.Fatalf("SessionTimeout %v after Connect", d)
	}
	l := zklock.New(c)
	key := dlocktest.Key(t)
	// A network blip: the client reconnects, trying the other address of
	// its list first.
	p.Cut()
	p.Heal()
	// Fixed: the sniffer refuses a reply that is not a ZooKeeper
	// handshake, so the timeout never changes while the client tries the
	// HTTP address (watched for a bounded 3s: several reconnect rounds).
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		if d, _ := zklock.SessionTimeout(c); d != sessionTimeout {
			t.Fatalf("SessionTimeout(c) = %v during the reconnect, want %v", d, sessionTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	// The client may still be cycling through its address list (one of
	// them answers garbage): an attempt caught mid-reconnect reports the
	// service unavailable, which is what a caller retries. Bounded: a few
	// attempts within the test's context.
	var (
		lk  *dlock.Lock
		err error
	)
	for range 5 {
		if lk, err = l.Acquire(dlocktest.Context(t), key); !errors.Is(err, dlock.ErrUnavailable) {
			break
		}
		t.Logf("Acquire during the reconnect: %v (retrying)", err)
	}
	if err != nil {
		t.Fatalf("Acquire after the reconnect: %v", err)
	}
	defer lk.Release(context.Background())
	if lk.TTL() != zklock.LeaseOf(sessionTimeout) {
		t.Fatalf("lock TTL %v, want %v", lk.TTL(), zklock.LeaseOf(sessionTimeout))
	}
	p.Stall()
	other := zklock.New(connect(t, []string{z.Addr()}))
	lk2 := dlocktest.AcquireWhenFree(t, other, key, lk)
	lk2.Release(context.Background())
}
