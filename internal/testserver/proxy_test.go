package testserver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hangBound bounds every wait that must succeed; exceeding it is a hang.
const hangBound = 10 * time.Second

// noAnswer is how long a request must stay unanswered to count as hung.
const noAnswer = 300 * time.Millisecond

// respConn is a raw RESP connection to a Redis server or a proxy.
type respConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialResp(t *testing.T, addr string) *respConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, hangBound)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &respConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *respConn) send(args ...string) {
	r.t.Helper()
	r.c.SetWriteDeadline(time.Now().Add(hangBound))
	if err := writeCommand(r.c, args...); err != nil {
		r.t.Fatalf("send %v: %v", args, err)
	}
}

// recv reads one reply, waiting at most d.
func (r *respConn) recv(d time.Duration) (string, error) {
	r.c.SetReadDeadline(time.Now().Add(d))
	return readReply(r.br)
}

// do sends a command and fails the test unless it is answered.
func (r *respConn) do(args ...string) string {
	r.t.Helper()
	r.send(args...)
	reply, err := r.recv(hangBound)
	if err != nil {
		r.t.Fatalf("%v: %v", args, err)
	}
	return reply
}

// expectHung checks that no reply comes within noAnswer and that the
// connection is still open (the read timed out rather than failed).
func (r *respConn) expectHung(what string) {
	r.t.Helper()
	reply, err := r.recv(noAnswer)
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		r.t.Fatalf("%s: want no answer, got %q, %v", what, reply, err)
	}
}

// expectReset checks that the connection fails (RST or EOF), and not by
// timing out.
func (r *respConn) expectReset(what string) {
	r.t.Helper()
	reply, err := r.recv(hangBound)
	if !isReset(err) {
		r.t.Fatalf("%s: want a reset connection, got %q, %v", what, reply, err)
	}
}

// expectDialReset checks that a connection to addr is reset: at once
// (the RST can beat the dialler's own connect check) or at the first
// request.
func expectDialReset(t *testing.T, addr, what string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, hangBound)
	if err != nil {
		if !isReset(err) {
			t.Fatalf("%s: dial: want a reset, got %v", what, err)
		}
		return
	}
	t.Cleanup(func() { c.Close() })
	r := &respConn{t: t, c: c, br: bufio.NewReader(c)}
	c.SetWriteDeadline(time.Now().Add(hangBound))
	writeCommand(c, "PING") // may already fail: the RST is in
	r.expectReset(what)
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.EPIPE)
}

// waitConns waits until the proxy counts n open connections.
func waitConns(t *testing.T, p *Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(hangBound)
	for p.Conns() != n {
		if time.Now().After(deadline) {
			t.Fatalf("proxy has %d connections after %v, want %d", p.Conns(), hangBound, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProxyPassThrough(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	if got := c.do("PING"); got != "PONG" {
		t.Fatalf("PING = %q", got)
	}
	big := string(make([]byte, 3*proxyBufSize+17)) // spans several chunks
	if got := c.do("SET", "big", big); got != "OK" {
		t.Fatalf("SET = %q", got)
	}
	if got := c.do("GET", "big"); got != big {
		t.Fatalf("GET big: %d bytes, want %d", len(got), len(big))
	}
	if got, err := r.Do("STRLEN", "big"); err != nil || got != strconv.Itoa(len(big)) {
		t.Fatalf("direct STRLEN = %q, %v", got, err)
	}
	c2 := dialResp(t, p.Addr())
	c2.do("PING")
	if n := p.Conns(); n != 2 {
		t.Fatalf("Conns = %d, want 2", n)
	}
}

// QUIT makes the server close first: the FIN is passed on, the client
// closes too and the proxy forgets the connection.
func TestProxyGracefulClose(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	if got := c.do("QUIT"); got != "OK" {
		t.Fatalf("QUIT = %q", got)
	}
	if _, err := c.recv(hangBound); !errors.Is(err, io.EOF) {
		t.Fatalf("after QUIT: want EOF, got %v", err)
	}
	c.c.Close()
	waitConns(t, p, 0)
}

func TestProxyStall(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	old := dialResp(t, p.Addr())
	old.do("PING")

	p.Stall()
	old.send("PING")
	old.expectHung("PING on a stalled connection")
	old.send("SET", "stalled", "1")
	fresh := dialResp(t, p.Addr()) // accepted, but not forwarded
	fresh.send("PING")
	fresh.expectHung("PING on a connection opened during the stall")
	if got, err := r.Do("GET", "stalled"); err != nil || got != "" {
		t.Fatalf("a stalled SET reached the server: GET = %q, %v", got, err)
	}
	waitConns(t, p, 2)

	p.Heal()
	for _, want := range []string{"PONG", "OK"} { // held bytes, in order
		if got, err := old.recv(hangBound); err != nil || got != want {
			t.Fatalf("after Heal: got %q, %v; want %q", got, err, want)
		}
	}
	if got, err := fresh.recv(hangBound); err != nil || got != "PONG" {
		t.Fatalf("after Heal, fresh connection: got %q, %v", got, err)
	}
	if got, err := r.Do("GET", "stalled"); err != nil || got != "1" {
		t.Fatalf("after Heal: GET = %q, %v", got, err)
	}
}

func TestProxyCut(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	old := dialResp(t, p.Addr())
	old.do("PING")

	p.Cut()
	if n := p.Conns(); n != 0 {
		t.Fatalf("Conns after Cut = %d, want 0", n)
	}
	old.c.SetWriteDeadline(time.Now().Add(hangBound))
	writeCommand(old.c, "PING") // may already fail: the RST is in
	old.expectReset("PING on a cut connection")

	// New connections complete the handshake and are reset at once.
	expectDialReset(t, p.Addr(), "connection opened after Cut")

	p.Heal()
	healed := dialResp(t, p.Addr())
	if got := healed.do("PING"); got != "PONG" {
		t.Fatalf("after Heal: PING = %q", got)
	}
}

// A Stall's held bytes are lost when the connection is cut.
func TestProxyCutWhileStalled(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	c.do("PING")
	p.Stall()
	c.send("SET", "held", "1")
	c.expectHung("stalled SET")
	p.Cut()
	c.expectReset("stalled then cut")
	p.Heal()
	if got, err := r.Do("EXISTS", "held"); err != nil || got != "0" {
		t.Fatalf("EXISTS held = %q, %v; want 0", got, err)
	}
}

func TestProxyLoseNextReply(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	victim := dialResp(t, p.Addr())
	victim.do("PING")
	other := dialResp(t, p.Addr())
	other.do("PING")

	p.LoseNextReply()
	victim.send("SET", "k", "v")
	victim.expectReset("SET whose reply is lost")
	if got, err := r.Do("GET", "k"); err != nil || got != "v" {
		t.Fatalf("direct GET k = %q, %v; the request should have taken effect", got, err)
	}
	if got := other.do("GET", "k"); got != "v" { // unaffected
		t.Fatalf("other connection: GET k = %q", got)
	}
	after := dialResp(t, p.Addr()) // one-shot
	if got := after.do("SET", "k", "w"); got != "OK" {
		t.Fatalf("SET after the lost reply = %q", got)
	}
	if n := p.Conns(); n != 2 {
		t.Fatalf("Conns = %d, want 2", n)
	}
}

// An armed fault is claimed by the first request, on whichever connection.
func TestProxyLoseNextReplyOtherConn(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	first := dialResp(t, p.Addr())
	first.do("PING")
	p.LoseNextReply()
	second := dialResp(t, p.Addr())
	second.send("INCR", "n")
	second.expectReset("INCR whose reply is lost")
	if got := first.do("GET", "n"); got != "1" {
		t.Fatalf("GET n = %q, want 1", got)
	}
	p.LoseNextReply()
	p.Heal() // disarms
	if got := first.do("INCR", "n"); got != "2" {
		t.Fatalf("INCR after Heal = %q, want 2", got)
	}
}

// LoseReplyAndCut: the request takes effect, its reply is dropped, and
// from that moment the link refuses everything until Heal, so a client's
// resend on a new connection cannot get through either.
func TestProxyLoseReplyAndCut(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	victim := dialResp(t, p.Addr())
	victim.do("PING")
	other := dialResp(t, p.Addr())
	other.do("PING")
	p.LoseReplyAndCut()
	victim.send("INCR", "n")
	victim.expectReset("INCR whose reply is lost")
	other.expectReset("another connection once the link is cut")
	expectDialReset(t, p.Addr(), "a new connection once the link is cut")
	if got, err := r.Do("GET", "n"); err != nil || got != "1" {
		t.Fatalf("direct GET n = %q, %v; the request should have taken effect once", got, err)
	}
	if n := p.Dropped(); n != 1 {
		t.Fatalf("Dropped = %d, want 1", n)
	}
	p.Heal()
	if got := dialResp(t, p.Addr()).do("INCR", "n"); got != "2" {
		t.Fatalf("INCR after Heal = %q, want 2", got)
	}
}

func TestProxyDelay(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	c.do("PING")
	const d = 150 * time.Millisecond
	p.Delay(d)
	start := time.Now()
	if got := c.do("PING"); got != "PONG" {
		t.Fatalf("delayed PING = %q", got)
	}
	// A lower bound only: the request and the reply are each delayed.
	if el := time.Since(start); el < 2*d {
		t.Fatalf("delayed PING answered after %v, want at least %v", el, 2*d)
	}
	p.Delay(0)
	if got := c.do("PING"); got != "PONG" {
		t.Fatalf("PING after Delay(0) = %q", got)
	}
}

// Nothing listens at the target: the client's connection is reset.
func TestProxyTargetDown(t *testing.T) {
	p := StartProxy(t, "127.0.0.1:"+strconv.Itoa(FreePort(t)))
	expectDialReset(t, p.Addr(), "connection to a dead target")
	waitConns(t, p, 0)
}

// Stop ends everything, including goroutines held by a Stall and a
// connection waiting to be dialled; goleak (TestMain) checks the rest.
func TestProxyStopWhileStalled(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	c := dialResp(t, p.Addr())
	c.do("PING")
	p.Stall()
	c.send("PING")
	fresh := dialResp(t, p.Addr())
	fresh.send("PING")
	waitConns(t, p, 2)
	p.Delay(time.Hour) // a delayed chunk must not hold Stop either
	p.Stop()
	p.Stop() // idempotent
	if n := p.Conns(); n != 0 {
		t.Fatalf("Conns after Stop = %d", n)
	}
	c.expectReset("stalled connection after Stop")
	fresh.expectReset("fresh connection after Stop")
	if _, err := net.DialTimeout("tcp", p.Addr(), hangBound); err == nil {
		t.Fatalf("the proxy still accepts after Stop")
	}
}

// Faults toggled while clients run: every request is eventually answered
// once the proxy heals. Run with -race.
func TestProxyConcurrentFaults(t *testing.T) {
	r := StartRedis(t)
	p := StartProxy(t, r.Addr())
	const clients, rounds = 4, 30
	conns := make([]*respConn, clients)
	for i := range conns {
		conns[i] = dialResp(t, p.Addr())
	}
	errc := make(chan error, clients)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "c" + strconv.Itoa(i)
			for j := 1; j <= rounds; j++ {
				c.c.SetWriteDeadline(time.Now().Add(hangBound))
				if err := writeCommand(c.c, "INCR", key); err != nil {
					errc <- err
					return
				}
				got, err := c.recv(hangBound)
				if err != nil || got != strconv.Itoa(j) {
					errc <- errors.New(key + ": INCR = " + got + ", " + errString(err))
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t.Cleanup(func() { // before the conns' own cleanups: unblock, then wait
		for _, c := range conns {
			c.c.Close()
		}
		<-done
	})
	for i := 0; i < 20; i++ {
		switch i % 3 {
		case 0:
			p.Stall()
		case 1:
			p.Delay(time.Millisecond)
		case 2:
			p.Heal()
		}
		_ = p.Conns()
		time.Sleep(5 * time.Millisecond)
	}
	p.Heal()
	select {
	case <-done:
	case <-time.After(3 * hangBound):
		t.Fatalf("clients did not finish within %v", 3*hangBound)
	}
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
