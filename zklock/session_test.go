package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// clientLog is a go-zookeeper logger that keeps the lines mentioning addr
// (the client logs every handshake it gives up on, with zklock's reason),
// so a test can wait for the client to have read and refused a server's
// handshake reply.
type clientLog struct {
	addr string
	mu   sync.Mutex
	n    int
	last string
}

func (l *clientLog) Printf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if !strings.Contains(line, l.addr) || !strings.Contains(line, "did not answer the handshake") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	l.last = line
}

// refusals is the number of handshake replies from addr the client refused.
func (l *clientLog) refusals() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// httpish is a listener that answers whatever it receives the way an HTTP
// server does (ZooKeeper's own AdminServer on :8080 is one): a "400 Bad
// Request" response; it then waits for the client to hang up.
type httpish struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startHTTPish(t testing.TB) *httpish {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &httpish{ln: ln, conns: map[net.Conn]struct{}{}}
	h.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns[c] = struct{}{}
			h.mu.Unlock()
			h.wg.Go(func() {
				defer func() {
					h.mu.Lock()
					delete(h.conns, c)
					h.mu.Unlock()
					c.Close()
				}()
				c.SetDeadline(time.Now().Add(dlocktest.HangTimeout))
				if _, err := c.Read(make([]byte, 512)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				io.Copy(io.Discard, c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		for c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	return h
}

func (h *httpish) Addr() string { return h.ln.Addr().String() }

// Connect to a list holding only an HTTP server reads and refuses its
// reply without allocating for the reply's bogus length (go-zookeeper
// takes "HTTP" for a 1.2 GB length). Not parallel: the bound is on the
// process's allocations while it runs.
// Symptom: 1.2 GB allocated on every attempt, stalling the process for seconds on each.
func TestConnect_HTTPServer_NoAllocationForItsReply(t *testing.T) {
	bad := startHTTPish(t)
	log := &clientLog{addr: bad.Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	go func() { // Connect ends once one reply was read and refused
		for ctx.Err() == nil && log.refusals() < 2 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c, err := zklock.Connect(ctx, []string{bad.Addr()}, sessionTimeout, zklock.WithLogger(log))
	runtime.ReadMemStats(&after)
	if err == nil {
		c.Close()
		t.Fatal("Connect to an HTTP server succeeded")
	}
	if n := log.refusals(); n < 2 {
		t.Fatalf("the client refused %d replies of the HTTP server within %v, want 2", n, dlocktest.HangTimeout)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 256<<20 {
		t.Fatalf("two attempts at an HTTP server allocated %d MB", got>>20)
	}
}

// A server list holding a port where an HTTP server listens: a reconnect
// that tries it must not take its reply for a session timeout (a lease of
// days on a 1.5s session), and the lock still loses before another client
// gets the key.
func TestConnect_LeaseFromGrantedTimeout_HTTPServerInList(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	p := testserver.StartProxy(t, z.Addr())
	t.Cleanup(p.Heal)
	bad := startHTTPish(t)
	log := &clientLog{addr: bad.Addr()}
	c := connectFor(t, []string{p.Addr(), bad.Addr()}, sessionTimeout, zklock.WithLogger(log))
	if d, _ := zklock.SessionTimeout(c); d != sessionTimeout {
		t.Fatalf("SessionTimeout %v after Connect", d)
	}
	l := zklock.New(c)
	key := dlocktest.Key(t)
	// A network blip: cut off from the real server, the client tries the
	// HTTP address; the test waits until it has read that reply and
	// refused it (Connect returned on the real server, so every earlier
	// try of the HTTP address is counted already).
	before := log.refusals()
	p.Cut()
	waitFor(t, "the client refused the HTTP address's reply", func() bool { return log.refusals() > before })
	if d, _ := zklock.SessionTimeout(c); d != sessionTimeout {
		t.Fatalf("SessionTimeout(c) = %v once the client read the HTTP reply (%s), want %v", d, log.last, sessionTimeout)
	}
	// The real server is back: the client has a session on it again
	// before the lock is taken.
	p.Heal()
	waitSession(t, c)
	lk, err := l.Acquire(dlocktest.Context(t), key)
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

// A server whose well-formed handshake reply grants a 0ms session (a
// wrong port, a hostile endpoint): Connect refuses it with an error; the
// process does not crash (go-zookeeper panics on a zero ping interval).
// Symptom: the process crashed with go-zookeeper's panic.
func TestConnect_RefusesZeroTimeoutHandshake_NoCrash(t *testing.T) {
	if os.Getenv("ZKTEST_CHILD") == "handshake" {
		zeroTimeoutHandshakeChild(t)
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestConnect_RefusesZeroTimeoutHandshake_NoCrash$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "ZKTEST_CHILD=handshake")
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

// zeroTimeoutHandshakeChild connects to a server granting 0ms sessions,
// until the client has refused its reply twice (Connect then ends with
// its context): a crash would have happened at the first.
func zeroTimeoutHandshakeChild(t *testing.T) {
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
	log := &clientLog{addr: ln.Addr().String()}
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	go func() {
		for log.refusals() < 2 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	c, err := zklock.Connect(ctx, []string{ln.Addr().String()}, 10*time.Second, zklock.WithLogger(log))
	t.Logf("Connect = %v (%d refusals: %s)", err, log.refusals(), log.last)
	if err == nil {
		time.Sleep(2 * time.Second) // the client's goroutines run meanwhile
		c.Close()
		t.Fatal("Connect to a server granting 0ms sessions succeeded")
	}
	if log.refusals() < 2 {
		t.Fatalf("Connect ended (%v) before the client refused the handshake twice", err)
	}
}

// firstHangs is a listener in front of a ZooKeeper server whose first
// connection hangs (accepted, never answered, as by a SIGSTOPped server);
// it forwards every later one to the server.
type firstHangs struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startFirstHangs(t testing.TB, target string) *firstHangs {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &firstHangs{ln: ln}
	track := func(c net.Conn) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.conns = append(f.conns, c)
	}
	f.wg.Go(func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			if n == 0 {
				continue // the hung server: never answers
			}
			s, err := net.DialTimeout("tcp", target, dlocktest.HangTimeout)
			if err != nil {
				c.Close()
				continue
			}
			track(s)
			f.wg.Go(func() { io.Copy(c, s); c.Close() })
			f.wg.Go(func() { io.Copy(s, c); s.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

// Connect's first server accepts the connection and never answers the
// handshake (a hung ensemble member): Connect moves on and gets a session
// from the next within its context (go-zookeeper alone would wait 10 x 2/3
// of the session timeout, 40s here, for the hung server's reply).
func TestConnect_GetsSession_FirstServerHung(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	f := startFirstHangs(t, z.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), dlocktest.HangTimeout)
	defer cancel()
	c, err := zklock.Connect(ctx, []string{f.ln.Addr().String()}, sessionTimeout, zklock.WithLogger(quiet{}))
	if err != nil {
		t.Fatalf("Connect with its first server hung: %v", err)
	}
	c.Close()
}

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
// with a lower maxSessionTimeout, emulated by the rewriter), and the link
// stalls right after it, so no renewal answers: the server expires the
// session after the new, shorter timeout, and the holder's Lost() closes
// before another client gets the key (doc.go: "Lost() closes before the
// session can expire on the server").
// Symptom: another client got the key while the holder's Lost() was still open.
func TestSessionTimeoutLoweredAtReconnect_LostBeforeTaken(t *testing.T) {
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
	// The reconnect that lowered the timeout loses the lock at once (its
	// lease no longer fits the session); what must hold either way is the
	// ordering below.
	t.Logf("after the reconnect: Err() = %v", lk.Err())
	other := zklock.New(connect(t, []string{z.Addr()}))
	lk2 := dlocktest.AcquireWhenFree(t, other, key, lk)
	lk2.Release(context.Background())
}

// Connect's context ends while the server hangs (accepts, never answers
// the handshake): Connect returns, and closes the connection it dialled,
// which go-zookeeper's goroutine would otherwise keep open reading the
// handshake reply for 10 x 2/3 of the session timeout (200s for a 30s
// session). Nothing is left behind by a call that returned by its context.
// Symptom: every failed Connect against a hung ensemble left a socket and a goroutine for minutes.
func TestConnect_ClosesConnToHungServer_WhenContextEnds(t *testing.T) {
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
