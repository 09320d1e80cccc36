// Sessions: Connect, which learns the session timeout the ensemble
// granted, and the lease a lock gets from it.

package zklock

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// Lease fraction: a lock's lease is this fraction of the negotiated session
// timeout (see docs/zklock.md, "Leases").
const (
	leaseNum = 2
	leaseDen = 3
)

// LeaseOf returns the lease a lock gets on a session whose negotiated
// timeout is d: two thirds of it.
func LeaseOf(d time.Duration) time.Duration { return d * leaseNum / leaseDen }

// LingerOf returns how long a lock's node may outlive its client's death
// on a session whose negotiated timeout is d: twice d. The leader expires
// the session d after it last heard from the client, rounded up to the
// next tick, and a follower passes the client's activity on to it up to
// half a tick late: with the timeout at least two ticks (ZooKeeper's
// default minSessionTimeout), 1.75 d at most; the rest covers committing
// the session's close. dlock.RunOnce refuses an atMostFor below it.
func LingerOf(d time.Duration) time.Duration { return 2 * d }

// lease returns the lease a lock gets now: LeaseOf the session timeout.
func (b *backend) lease() (time.Duration, error) {
	d := b.fixed
	if b.info != nil {
		d = time.Duration(b.info.ms.Load()) * time.Millisecond
	}
	if d < MinSessionTimeout {
		return 0, fmt.Errorf("%w: zklock: session timeout %v is below %v", dlock.ErrInvalidOption, d, MinSessionTimeout)
	}
	return LeaseOf(d), nil
}

// dials is the number of network connections the client has dialled, and
// whether it is known (only for a connection Connect made): equal counts
// before and after a span of requests mean they all went over one
// connection, to one server.
func (b *backend) dials() (int64, bool) {
	if b.info == nil {
		return 0, false
	}
	return b.info.dials.Load(), true
}

// sessionInfo is what Connect learned about a connection: the session
// timeout the server granted at the last handshake, the network
// connections it dialled, and the held locks to tell when a reconnect
// lowers the timeout.
type sessionInfo struct {
	ms    atomic.Int64
	dials atomic.Int64 // network connections dialled so far

	mu      sync.Mutex
	conns   map[*sniffConn]struct{}
	held    map[*entry]func(error)
	lastErr error // a handshake refused by the sniffer
}

// track records a dialled connection until it is closed.
func (s *sessionInfo) track(c *sniffConn) {
	s.dials.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		s.conns = map[*sniffConn]struct{}{}
	}
	s.conns[c] = struct{}{}
}

func (s *sessionInfo) untrack(c *sniffConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeAll closes every dialled connection (a Connect that failed: the
// client may be blocked reading a handshake reply that never comes).
func (s *sessionInfo) closeAll() {
	s.mu.Lock()
	cs := make([]*sniffConn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// hold registers a held lock to lose if a reconnect lowers the session
// timeout below what its lease assumes; the returned function forgets it.
func (s *sessionInfo) hold(e *entry, lose func(error)) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = map[*entry]func(error){}
	}
	s.held[e] = lose
	return func() {
		s.mu.Lock()
		delete(s.held, e)
		s.mu.Unlock()
	}
}

// granted records the timeout of a handshake. A timeout lower than the
// last one shortens the session from now on: every held lock whose lease
// no longer fits is lost at once (its renewal might never answer, and its
// local deadline counts from the old timeout).
func (s *sessionInfo) granted(ms int64) {
	old := s.ms.Swap(ms)
	if old <= 0 || ms >= old {
		return
	}
	lease := LeaseOf(time.Duration(ms) * time.Millisecond)
	s.mu.Lock()
	var lost []func()
	for e, lose := range s.held {
		if e.lease > lease {
			cause := e.notHeld(fmt.Sprintf("a reconnect lowered the session timeout to %v, below what its %v lease needs", time.Duration(ms)*time.Millisecond, e.lease))
			lost = append(lost, func() { lose(cause) })
		}
	}
	s.mu.Unlock()
	for _, f := range lost {
		go f()
	}
}

func (s *sessionInfo) refused(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
}

// sessions maps connections made by Connect to what their handshakes said.
// Keys are weak: a connection the program dropped is forgotten.
var sessions sync.Map // weak.Pointer[zk.Conn] → *sessionInfo

func register(c *zk.Conn, s *sessionInfo) {
	k := weak.Make(c)
	sessions.Store(k, s)
	runtime.AddCleanup(c, func(k weak.Pointer[zk.Conn]) { sessions.Delete(k) }, k)
}

func lookup(c *zk.Conn) *sessionInfo {
	if v, ok := sessions.Load(weak.Make(c)); ok {
		return v.(*sessionInfo)
	}
	return nil
}

// SessionTimeout returns the session timeout the ensemble granted to a
// connection made by Connect (it may differ from the one asked for: the
// server clamps it to [2, 20] ticks by default), or false for a connection
// made otherwise.
func SessionTimeout(c *zk.Conn) (time.Duration, bool) {
	s := lookup(c)
	if s == nil || s.ms.Load() <= 0 {
		return 0, false
	}
	return time.Duration(s.ms.Load()) * time.Millisecond, true
}

// sniffConn reads the server's reply to the connect handshake as it passes
// by: [length][protocol version][timeout ms][session id][password length]
// [password]... It also bounds the handshake (see handshakeBound).
type sniffConn struct {
	net.Conn
	s          *sessionInfo
	hsDeadline time.Time
	head       [24]byte
	n          int
	done       bool // the handshake reply was read (or refused)
}

// handshakeBound is how long a server may take to answer the connect
// handshake: a third of the session timeout, within [1s, 5s].
// go-zookeeper waits ten times two thirds of the session timeout, so one
// hung member of a healthy ensemble (the kernel accepts its connections,
// nothing answers) would make Connect miss its deadline although a quorum
// was there.
func handshakeBound(session time.Duration) time.Duration {
	return min(max(session/3, time.Second), 5*time.Second)
}

// SetReadDeadline passes the client's deadline on, bounded by the
// handshake's until the handshake reply has been read.
func (c *sniffConn) SetReadDeadline(t time.Time) error {
	if !c.done && (t.IsZero() || t.After(c.hsDeadline)) {
		t = c.hsDeadline
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline for reads.
func (c *sniffConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

// Read passes the server's bytes on, reading the handshake reply on the
// way. A reply that is not a ZooKeeper connect response granting a
// session (a wrong port, an HTTP server, a hostile endpoint), or one with
// a timeout go-zookeeper cannot work with (zero: it would panic on a zero
// ping interval), fails the read instead, so the client drops that server
// and its bytes are never taken for a session timeout.
//
// The reply's length prefix is judged as soon as its 4 bytes are in,
// before the client sees them: go-zookeeper reads the prefix alone and
// allocates a buffer of that length for the rest, so an HTTP server's
// "HTTP" (1.2 GB) would cost the process a 1.2 GB allocation on every
// attempt of its reconnect loop.
func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		had := c.n
		c.n += copy(c.head[c.n:], p[:n])
		if had < 4 && c.n >= 4 {
			if length := binary.BigEndian.Uint32(c.head[0:4]); length < connectReplyMin || length > connectReplyMax {
				return 0, c.refuse(fmt.Errorf("dlock: zklock: %s did not answer the handshake as a ZooKeeper server does (a reply of %d bytes)", c.RemoteAddr(), length))
			}
		}
		if c.n == len(c.head) {
			c.done = true
			length := binary.BigEndian.Uint32(c.head[0:4])
			proto := binary.BigEndian.Uint32(c.head[4:8])
			ms := int32(binary.BigEndian.Uint32(c.head[8:12]))
			sid := int64(binary.BigEndian.Uint64(c.head[12:20]))
			pwlen := binary.BigEndian.Uint32(c.head[20:24])
			switch {
			// Every reply carries a 16-byte password, an expired session's
			// too (go-zookeeper allocates what that length field says),
			// and a live session's reply a timeout above zero.
			case proto != 0 || pwlen != 16 || (sid != 0 && ms <= 0):
				return 0, c.refuse(fmt.Errorf("dlock: zklock: %s did not answer the handshake as a ZooKeeper server does (length %d, protocol %d, timeout %dms, password length %d)", c.RemoteAddr(), length, proto, ms, pwlen))
			case sid == 0: // the session had expired: no timeout granted
			default:
				c.s.granted(int64(ms))
			}
		}
	}
	return n, err
}

// The length of a connect reply: protocol version, timeout, session id,
// a 16-byte password with its length (36), and a read-only flag from
// servers that send it; the rest is headroom.
const (
	connectReplyMin = 36
	connectReplyMax = 64
)

// refuse ends the handshake with err: the client's read fails and the
// connection is closed, so it drops this server.
func (c *sniffConn) refuse(err error) error {
	c.done = true
	c.s.refused(err)
	c.Conn.Close()
	return err
}

// Close closes the connection and forgets it.
func (c *sniffConn) Close() error {
	c.s.untrack(c)
	return c.Conn.Close()
}

// Connect connects to a ZooKeeper ensemble (servers as "host:port") and
// waits, within ctx, until it has a session. It records the session
// timeout the ensemble granted, so that New gives locks a lease that the
// session honours; a connection made with zk.Connect needs
// WithSessionTimeout instead. A ctx that ends first (an unreachable or hung
// ensemble) returns an error wrapping dlock.ErrUnavailable and the
// context's cause. The caller closes the connection.
func Connect(ctx context.Context, servers []string, sessionTimeout time.Duration, opts ...Option) (*zk.Conn, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: zklock.Connect: nil context", dlock.ErrInvalidOption)
	}
	var o options
	driver.Apply(&o, opts)
	switch {
	case len(servers) == 0:
		return nil, fmt.Errorf("%w: zklock.Connect: no servers", dlock.ErrInvalidOption)
	case sessionTimeout < time.Millisecond || sessionTimeout > time.Duration(1<<31-1)*time.Millisecond:
		return nil, fmt.Errorf("%w: zklock.Connect: session timeout %v out of range", dlock.ErrInvalidOption, sessionTimeout)
	case o.digest && o.user == "":
		return nil, fmt.Errorf("%w: zklock.Connect: digest auth with an empty user", dlock.ErrInvalidOption)
	case o.digest && strings.Contains(o.user, ":"):
		return nil, fmt.Errorf("%w: zklock.Connect: digest user %q contains ':'", dlock.ErrInvalidOption, o.user)
	}
	for _, s := range servers {
		host, port, err := net.SplitHostPort(s)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%w: zklock.Connect: server %q is not host:port", dlock.ErrInvalidOption, s)
		}
	}
	info := &sessionInfo{}
	dial := func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		sc := &sniffConn{Conn: c, s: info, hsDeadline: time.Now().Add(handshakeBound(sessionTimeout))}
		info.track(sc)
		return sc, nil
	}
	ready := make(chan struct{})
	var once sync.Once
	logger := o.logger
	if logger == nil {
		logger = zk.DefaultLogger
	}
	conn, _, err := zk.Connect(servers, sessionTimeout, zk.WithDialer(dial), zk.WithLogger(logger),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
				once.Do(func() { close(ready) })
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("%w: zklock.Connect %v: %w", dlock.ErrUnavailable, servers, err)
	}
	select {
	case <-ready:
	case <-ctx.Done():
		// The client may be blocked reading a handshake reply: close what
		// it dialled, and let Close (which waits up to a second to send
		// its goodbye) finish in the background.
		info.closeAll()
		background.Go(conn.Close)
		info.mu.Lock()
		why := info.lastErr
		info.mu.Unlock()
		if why != nil {
			return nil, fmt.Errorf("%w: zklock.Connect %v: no session before the context ended (%v): %w", dlock.ErrUnavailable, servers, why, context.Cause(ctx))
		}
		return nil, fmt.Errorf("%w: zklock.Connect %v: no session before the context ended: %w", dlock.ErrUnavailable, servers, context.Cause(ctx))
	}
	if o.digest {
		// AddAuth blocks until the server answers: bound it by ctx.
		done := make(chan error, 1)
		go func() { done <- conn.AddAuth("digest", []byte(o.user+":"+o.password)) }()
		select {
		case err = <-done:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		if err != nil {
			info.closeAll()
			background.Go(conn.Close)
			return nil, fmt.Errorf("%w: zklock.Connect %v: digest auth: %w", dlock.ErrUnavailable, servers, err)
		}
	}
	register(conn, info)
	return conn, nil
}
