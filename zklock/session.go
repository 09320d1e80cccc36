// Sessions: Connect, which learns the session timeout the ensemble
// granted, and the lease a lock gets from it.

package zklock

import (
	"context"
	"encoding/binary"
	"errors"
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
)

// Lease fraction: a lock's lease is this fraction of the negotiated session
// timeout (see the package documentation, "Leases").
const (
	leaseNum = 2
	leaseDen = 3
)

// LeaseOf returns the lease a lock gets on a session whose negotiated
// timeout is d: two thirds of it.
func LeaseOf(d time.Duration) time.Duration { return d * leaseNum / leaseDen }

// sessionInfo is what Connect learned about a connection: the session
// timeout the server granted at the last handshake.
type sessionInfo struct {
	ms atomic.Int64
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
// by: [length][protocol version][timeout ms][session id]...
type sniffConn struct {
	net.Conn
	s    *sessionInfo
	head [20]byte
	n    int
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n < len(c.head) && n > 0 {
		c.n += copy(c.head[c.n:], p[:n])
		if c.n == len(c.head) {
			ms := int32(binary.BigEndian.Uint32(c.head[8:12]))
			sid := int64(binary.BigEndian.Uint64(c.head[12:20]))
			if sid != 0 && ms > 0 { // 0: the session had expired
				c.s.ms.Store(int64(ms))
			}
		}
	}
	return n, err
}

// WithDigest makes Connect authenticate with ZooKeeper's digest scheme as
// user:password (and again after every reconnect), and makes the Locker
// create its znodes readable and writable by that identity only
// (zk.DigestACL). A wrong password is not refused at connect time
// (ZooKeeper's digest scheme never refuses an identity): it shows as an
// error wrapping zk.ErrNoAuth on the first lock of a path made by the
// right one.
func WithDigest(user, password string) Option {
	return driver.Setting(func(o *options) { o.user, o.password, o.digest = user, password, true })
}

// WithLogger sets the go-zookeeper client's logger for Connect (default:
// the client's own, the standard log package).
func WithLogger(l zk.Logger) Option {
	return driver.Setting(func(o *options) { o.logger = l })
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
		return &sniffConn{Conn: c, s: info}, nil
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
		conn.Close()
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
			conn.Close()
			return nil, fmt.Errorf("%w: zklock.Connect %v: digest auth: %w", dlock.ErrUnavailable, servers, err)
		}
	}
	register(conn, info)
	return conn, nil
}

var errNoTimeout = errors.New("dlock: zklock: the connection's session timeout is unknown: connect with zklock.Connect, or pass zklock.WithSessionTimeout with the timeout given to zk.Connect")
