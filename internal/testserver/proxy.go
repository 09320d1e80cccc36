package testserver

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// proxyDialTimeout bounds how long the proxy waits to connect to its target.
const proxyDialTimeout = 10 * time.Second

// proxyStopTimeout bounds how long Stop waits for the proxy's goroutines.
const proxyStopTimeout = 10 * time.Second

// proxyBufSize is the largest chunk one copy goroutine reads at a time.
const proxyBufSize = 32 << 10

// Proxy is a TCP proxy on a loopback port that tests put between a client
// and a real server to inject network faults: a stalled link (the server
// looks hung), a cut link (the server looks dead), a lost reply (the
// request took effect but the client never hears so) and latency.
//
// Each accepted connection is forwarded to the target over its own
// connection, one chunk (one read) at a time, by one goroutine per
// direction. Its methods are safe for concurrent use.
type Proxy struct {
	t      TB
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Stop; bounds dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection goroutine

	mu      sync.Mutex
	cond    *sync.Cond // broadcast on every state change, under mu
	closed  bool
	stalled bool
	cut     bool
	lose    bool // LoseNextReply armed, not yet claimed by a connection
	loseCut bool // the armed fault cuts the link once the reply is lost
	delay   time.Duration
	dropped int       // replies dropped by an armed lost-reply fault
	heldAt  time.Time // when the current Stall first held a client's bytes
	conns   map[*proxyConn]struct{}
}

// proxyConn is one proxied connection: the accepted client side and the
// connection to the target (nil until dialled).
type proxyConn struct {
	client net.Conn
	server net.Conn
	done   chan struct{} // closed when the connection is closed or reset
	dead   bool          // closed or reset; under Proxy.mu
	eofs   int           // directions that ended with a half-close; under Proxy.mu
	// loseReply is set (under Proxy.mu) when this connection forwarded the
	// request that claimed an armed LoseNextReply: the next chunk from the
	// server is dropped and the connection reset.
	loseReply bool
	// cutOnLoss: dropping that reply also cuts the link (LoseReplyAndCut).
	cutOnLoss bool
}

// StartProxy listens on a free 127.0.0.1 port and forwards every accepted
// connection to target (host:port, loopback). It starts in pass-through
// mode and is stopped at t.Cleanup: every connection is closed and every
// goroutine of the proxy has ended before the cleanup returns.
//
// The port comes from FreePort, so no other proxy or server of the
// machine's tests is given it, even after Stop: a client that dials a
// stopped proxy is refused, never connected to whatever listened there
// next (a port of the kernel's ephemeral range is handed out again soon).
func StartProxy(t TB, target string) *Proxy {
	t.Helper()
	var ln net.Listener
	var err error
	for range 3 { // FreePort's port was free a moment ago, not now
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))))
		if err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("proxy: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{t: t, target: target, ln: ln, ctx: ctx, cancel: cancel,
		conns: make(map[*proxyConn]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Stop)
	return p
}

// Addr is the proxy's address ("127.0.0.1:port"), to give to the client.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Stall holds the bytes in both directions of every connection, existing
// and new, until Heal: connections stay open and the client sees a hung
// server rather than an error. New connections are still accepted (the TCP
// handshake completes, as the kernel does for a SIGSTOPped server) but
// nothing is forwarded, and the target is not dialled until Heal. A stalled
// direction stops reading from its source after at most one chunk, so TCP
// back-pressure builds up as it would in front of a hung server.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.heldAt = time.Time{}
	}
	p.stalled = true
	p.cond.Broadcast()
}

// Held reports when the current Stall first held bytes a client sent
// (a request sent into the hung link, as far as the client can tell), and
// whether it has yet.
func (p *Proxy) Held() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldAt, p.stalled && !p.heldAt.IsZero()
}

// Cut resets (RST) every open connection, and every new connection as soon
// as it is accepted, until Heal: the client sees a dead server. Bytes held
// by a Stall on those connections are lost.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		p.resetLocked(c)
	}
	p.cond.Broadcast()
}

// LoseNextReply arms a one-shot fault: the next request a client sends, on
// any connection, is forwarded to the server, but the server's reply to it
// is discarded and that connection is then reset (RST). The request took
// effect; the client never learns it. Other connections are unaffected.
//
// "The next request" is the next client-to-server chunk forwarded after
// the call; that claims the fault for its connection. "Its reply" is the
// first server-to-client chunk the proxy reads on that connection after it
// started forwarding that request. Protocols that pipeline requests or
// push unsolicited data on the connection may thus lose a different chunk;
// request/reply clients (Redis commands, a unary gRPC call) lose the reply.
// If the connection ends before a reply arrives, the fault is spent.
func (p *Proxy) LoseNextReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lose, p.loseCut = true, false
}

// LoseReplyAndCut is LoseNextReply, and the moment the reply is dropped
// the link is cut as by Cut, until Heal: the request took effect, and
// neither its reply nor a client's resend of it on a new connection gets
// through. A client that resends a command whose reply was lost
// (go-redis does, on a new connection) would otherwise race the test's
// own Cut.
func (p *Proxy) LoseReplyAndCut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lose, p.loseCut = true, true
}

// Dropped counts the replies LoseNextReply and LoseReplyAndCut dropped.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// Delay delays every forwarded chunk, in both directions, by d before it
// is written on; 0 turns the delay off. Chunks stay in order.
func (p *Proxy) Delay(d time.Duration) {
	if d < 0 {
		d = 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Heal returns the proxy to pass-through: it ends a Stall (the bytes held
// are delivered, in order) and a Cut (new connections are forwarded
// again), turns Delay off and disarms a LoseNextReply that has not been
// claimed by a request yet. Connections reset by Cut stay reset.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled, p.cut, p.lose, p.loseCut, p.delay = false, false, false, false, 0
	p.cond.Broadcast()
}

// Conns is the number of open proxied connections: accepted and neither
// closed by both ends nor reset.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Stop closes the listener, resets every connection and waits for every
// goroutine of the proxy to end, including those held by a Stall. It is
// idempotent and runs at the cleanup of the test that started the proxy.
func (p *Proxy) Stop() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	p.cancel()
	for c := range p.conns {
		p.resetLocked(c)
	}
	p.cond.Broadcast()
	p.mu.Unlock()

	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(proxyStopTimeout):
		p.t.Errorf("proxy %s -> %s: goroutines still running %v after Stop", p.Addr(), p.target, proxyStopTimeout)
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error (out of file descriptors, aborted
			// handshake): back off a little; Stop ends the loop.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		c := &proxyConn{client: nc, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.cut {
			p.mu.Unlock()
			resetConn(nc)
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c)
	}
}

// serve connects c to the target (once no Stall holds it) and copies the
// client-to-server direction, another goroutine the other one.
func (p *Proxy) serve(c *proxyConn) {
	defer p.wg.Done()
	p.mu.Lock()
	for p.stalled && !c.dead {
		p.cond.Wait()
	}
	dead := c.dead
	p.mu.Unlock()
	if dead {
		return
	}
	d := net.Dialer{Timeout: proxyDialTimeout}
	sc, err := d.DialContext(p.ctx, "tcp", p.target)
	p.mu.Lock()
	if err != nil || c.dead {
		if sc != nil {
			resetConn(sc)
		}
		p.resetLocked(c) // the target refused: the client sees a reset
		p.mu.Unlock()
		return
	}
	c.server = sc
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		p.pipe(c, sc, c.client, false)
	}()
	p.pipe(c, c.client, sc, true)
}

// pipe copies src to dst one chunk at a time until src ends or c is reset.
// toServer tells the direction (client to server when true).
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn, toServer bool) {
	buf := make([]byte, proxyBufSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.sleep(c) {
				return
			}
			switch p.admit(c, toServer, false) {
			case chunkStop:
				return
			case chunkDrop:
				return // admit reset the connection
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.reset(c)
				return
			}
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			p.reset(c) // reset by the peer, or closed by Cut or Stop
			return
		}
		// The source half-closed: pass the FIN on in order, after any
		// bytes a Stall holds, and stop this direction.
		if p.admit(c, toServer, true) != chunkForward {
			return
		}
		p.halfClose(c, dst)
		return
	}
}

// chunk verdicts of admit.
const (
	chunkForward = iota // write the chunk on
	chunkDrop           // the chunk was a lost reply: c was reset
	chunkStop           // c is closed or reset: stop copying
)

// admit waits while a Stall holds c, then decides what becomes of a chunk
// (fin: of the end of stream) read in the given direction.
func (p *Proxy) admit(c *proxyConn, toServer, fin bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled && toServer && !fin && p.heldAt.IsZero() {
		p.heldAt = time.Now()
	}
	for p.stalled && !c.dead {
		p.cond.Wait()
	}
	switch {
	case c.dead:
		return chunkStop
	case toServer && !fin && p.lose:
		// This request claims the armed fault; claim it before the
		// request is written so that a fast reply cannot slip past.
		p.lose = false
		c.loseReply, c.cutOnLoss = true, p.loseCut
	case !toServer && c.loseReply:
		p.dropped++
		p.resetLocked(c)
		if c.cutOnLoss {
			p.cut = true
			for o := range p.conns {
				p.resetLocked(o)
			}
		}
		return chunkDrop
	}
	return chunkForward
}

// sleep waits out the current Delay; false if c was reset meanwhile.
func (p *Proxy) sleep(c *proxyConn) bool {
	p.mu.Lock()
	d := p.delay
	p.mu.Unlock()
	if d <= 0 {
		return true
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-c.done:
		return false
	}
}

// halfClose passes a FIN on to dst; when both directions have ended that
// way, the connection is closed (gracefully) and forgotten.
func (p *Proxy) halfClose(c *proxyConn, dst net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.dead {
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.eofs++
	if c.eofs < 2 {
		return
	}
	c.dead = true
	close(c.done)
	c.client.Close()
	c.server.Close()
	delete(p.conns, c)
	p.cond.Broadcast()
}

func (p *Proxy) reset(c *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetLocked(c)
}

// resetLocked resets both sides of c (idempotent); p.mu is held.
func (p *Proxy) resetLocked(c *proxyConn) {
	if c.dead {
		return
	}
	c.dead = true
	close(c.done)
	resetConn(c.client)
	if c.server != nil {
		resetConn(c.server)
	}
	delete(p.conns, c)
	p.cond.Broadcast()
}

// resetConn closes nc with an RST rather than a FIN.
func resetConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	nc.Close()
}

// Proxies is a link to several servers: each fault applies to every proxy
// of the set (LoseNextReply arms each of them).
type Proxies []*Proxy

// Stall stalls every proxy.
func (ps Proxies) Stall() {
	for _, p := range ps {
		p.Stall()
	}
}

// Cut cuts every proxy.
func (ps Proxies) Cut() {
	for _, p := range ps {
		p.Cut()
	}
}

// LoseNextReply arms every proxy.
func (ps Proxies) LoseNextReply() {
	for _, p := range ps {
		p.LoseNextReply()
	}
}

// LoseReplyAndCut arms every proxy with LoseReplyAndCut.
func (ps Proxies) LoseReplyAndCut() {
	for _, p := range ps {
		p.LoseReplyAndCut()
	}
}

// Dropped sums the replies every proxy dropped.
func (ps Proxies) Dropped() int {
	n := 0
	for _, p := range ps {
		n += p.Dropped()
	}
	return n
}

// Heal heals every proxy.
func (ps Proxies) Heal() {
	for _, p := range ps {
		p.Heal()
	}
}
