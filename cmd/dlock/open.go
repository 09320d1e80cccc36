package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/zklock"
)

// open creates the clients. Only etcd (its client dials in the background)
// and Sentinel URLs of several addresses (answeringSentinels) touch the
// network here; probes come after. ZooKeeper connects in its probe: a
// session is the first thing to wait for.
func (t *target) open(o openOptions) (*backend, error) {
	switch t.Scheme {
	case "file":
		if o.readOnly {
			if _, err := os.Stat(t.Dir); errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s: %w", t.where, errNoLockDir)
			}
		}
		l, err := filelock.New(t.Dir, o.lockOptions()...)
		if err != nil {
			return nil, err
		}
		return &backend{locker: l, close: func() {}, where: t.where}, nil
	case "redis", "rediss":
		plain := *t // go-redis's URL: without dlock's own options
		plain.CA, plain.Cert, plain.Key = "", "", ""
		plain.Acks, plain.AckTimeout, plain.UnsafeEviction = 0, 0, false
		plain.LockProtocol = redislock.ProtocolAuto
		opt, err := redis.ParseURL(plain.URL())
		if err != nil { // parseURL accepted it: cannot happen
			return nil, &urlError{scrub(fmt.Sprintf("%v %q: %v", errBadURL, t.where, err), t.secrets)}
		}
		t.tune(opt, o)
		if t.TLS {
			if err := t.addTLSFiles(opt.TLSConfig); err != nil {
				return nil, err
			}
		}
		return t.redisBackend(redis.NewClient(opt), o), nil
	case "redis+cluster", "rediss+cluster":
		return t.openCluster(o)
	case "redis+sentinel", "rediss+sentinel":
		opt := &redis.FailoverOptions{
			MasterName: t.Master, SentinelAddrs: t.Addrs, DB: t.DB,
			Username: t.Username, Password: t.Password,
			SentinelUsername: t.SentinelUsername, SentinelPassword: t.SentinelPassword,
			DialTimeout: o.connectTimeout, ReadTimeout: clientIOTimeout, WriteTimeout: clientIOTimeout,
			ContextTimeoutEnabled: true,
		}
		if t.TLS {
			var err error
			if opt.TLSConfig, err = t.tlsConfig(); err != nil {
				return nil, err
			}
		}
		if len(opt.SentinelAddrs) > 1 {
			// Half the budget at most: when none answers, the probe
			// still has time to find out why (a TLS mismatch, say).
			var silent []silentSentinel
			all := len(opt.SentinelAddrs)
			opt.SentinelAddrs, silent = answeringSentinels(opt, o.start.Add(o.connectTimeout/2))
			// ls always says which Sentinels it leaves out, other
			// commands with --verbose. ls warns itself about the
			// addresses that refuse connections (endpointWarnings):
			// not twice.
			if o.logs != nil && (o.warnSentinels || o.verbose) {
				for _, w := range sentinelWarnings(silent, len(opt.SentinelAddrs), all, o.warnSentinels) {
					fmt.Fprintln(o.logs, w)
				}
			}
		}
		return t.redisBackend(redis.NewFailoverClient(opt), o), nil
	case "redlock", "redlocks":
		return t.openRedlock(o)
	case "etcd", "etcds":
		return t.openEtcd(o)
	case "zk":
		return t.openZK(o), nil
	case "postgres", "postgresql":
		return t.openPostgres(o)
	}
	return nil, badURL(t.URL(), "unknown scheme %q", t.Scheme)
}

// tune sets the CLI's client timeouts where the URL did not.
func (t *target) tune(opt *redis.Options, o openOptions) {
	if !t.Options.Has("dial_timeout") {
		opt.DialTimeout = o.connectTimeout
	}
	if !t.Options.Has("read_timeout") {
		opt.ReadTimeout = clientIOTimeout
	}
	if !t.Options.Has("write_timeout") {
		opt.WriteTimeout = clientIOTimeout
	}
	opt.ContextTimeoutEnabled = true
}

func (t *target) redisBackend(c redis.UniversalClient, o openOptions) *backend {
	opts := o.lockOptions()
	if t.Acks > 0 {
		opts = append(opts, redislock.WithReplicaAcks(t.Acks, t.AckTimeout))
	}
	if t.UnsafeEviction {
		opts = append(opts, redislock.WithUnsafeEviction())
	}
	if t.LockProtocol != redislock.ProtocolAuto {
		opts = append(opts, redislock.WithProtocol(t.LockProtocol))
	}
	l := redislock.New(c, opts...)
	probe := func(ctx context.Context) error { return c.Ping(ctx).Err() }
	name := "redis " + strings.Join(t.Addrs, ",")
	if t.Master != "" {
		name = "redis master " + strconv.Quote(t.Master)
	}
	return &backend{locker: l, probe: probe, close: func() { c.Close() }, where: t.where, redis: []redisServer{{name, c}}}
}

// openRedlock makes one client per independent master. The probe PINGs
// them all; a majority must answer.
func (t *target) openRedlock(o openOptions) (*backend, error) {
	var tlsCfg *tls.Config
	if t.TLS {
		var err error
		if tlsCfg, err = t.tlsConfig(); err != nil {
			return nil, err
		}
	}
	clients := make([]redis.UniversalClient, len(t.Addrs))
	for i, a := range t.Addrs {
		clients[i] = redis.NewClient(&redis.Options{
			Addr: a, Username: t.Username, Password: t.Password, DB: t.DB,
			DialTimeout: o.connectTimeout, ReadTimeout: clientIOTimeout, WriteTimeout: clientIOTimeout,
			ContextTimeoutEnabled: true, TLSConfig: tlsCfg,
		})
	}
	ropts := o.lockOptions()
	if t.UnsafeEviction {
		ropts = append(ropts, redlock.WithUnsafeEviction())
	}
	l := redlock.New(clients, ropts...)
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	probe := func(ctx context.Context) error {
		errs := make([]error, len(clients))
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() { errs[i] = c.Ping(ctx).Err() })
		}
		wg.Wait()
		var failed []string
		for i, err := range errs {
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", t.Addrs[i], err))
			}
		}
		if quorum := len(clients)/2 + 1; len(clients)-len(failed) < quorum {
			return fmt.Errorf("%d of %d nodes answered, a majority (%d) is needed: %s", len(clients)-len(failed), len(clients), quorum, strings.Join(failed, "; "))
		}
		return nil
	}
	b := &backend{locker: l, probe: probe, close: closeAll, where: t.where}
	b.nodes = redlockNodes(t.Addrs, clients) // ls: per-node state
	for i, c := range clients {
		b.redis = append(b.redis, redisServer{"redis node " + t.Addrs[i], c})
	}
	return b, nil
}

// openEtcd connects to etcd; the probe is a count-only read.
func (t *target) openEtcd(o openOptions) (*backend, error) {
	scheme := "http"
	var tlsCfg *tls.Config
	if t.TLS {
		var err error
		if tlsCfg, err = t.tlsConfig(); err != nil {
			return nil, err
		}
		scheme = "https"
	}
	var eps []string
	for _, a := range t.Addrs {
		eps = append(eps, scheme+"://"+a)
	}
	cfg := clientv3.Config{
		Endpoints: eps, DialTimeout: o.connectTimeout, TLS: tlsCfg,
		Username: t.Username, Password: t.Password,
		Logger: etcdLogger(o, t.secrets),
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", t.where, err)
	}
	l := etcdlock.New(c, append(o.lockOptions(), etcdlock.WithPrefix(t.Prefix))...)
	probe := func(ctx context.Context) error {
		_, err := c.Get(ctx, "dlock-probe", clientv3.WithCountOnly())
		return err
	}
	return &backend{locker: l, probe: probe, close: func() { c.Close() }, where: t.where}, nil
}

// zkConn is the connection of a zk:// backend, made by its probe: close
// may come first (a probe that timed out), and then closes it on arrival.
type zkConn struct {
	mu     sync.Mutex
	conn   *zk.Conn
	closed bool
}

func (c *zkConn) set(conn *zk.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return false
	}
	c.conn = conn
	return true
}

func (c *zkConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil {
		c.conn.Close()
	}
}

// openZK prepares a ZooKeeper backend. Its probe connects (Connect waits
// for a session) and reads the znode the locks live under, which finds
// wrong credentials before any lock is asked for.
func (t *target) openZK(o openOptions) *backend {
	prefix := t.Chroot
	if prefix == "" {
		prefix = zklock.DefaultPrefix
	}
	session := t.SessionTimeout
	if session == 0 {
		session = defaultSessionTimeout
	}
	var auth []zklock.Option
	if t.Username != "" {
		auth = append(auth, zklock.WithDigest(t.Username, t.Password))
	}
	logs := newZKLogger(o, t.secrets)
	c := &zkConn{}
	b := &backend{close: c.close, where: t.where}
	b.probe = func(ctx context.Context) error {
		conn, err := zkConnect(ctx, t.Addrs, session, append(auth, zklock.WithLogger(logs))...)
		if err != nil {
			if last := logs.last(); last != "" {
				err = fmt.Errorf("%w (last: %s)", err, last)
			}
			return err
		}
		if !c.set(conn) {
			return fmt.Errorf("%w: zookeeper: the connection was closed", dlock.ErrUnavailable)
		}
		l := zklock.New(conn, append(append(o.lockOptions(), auth...), zklock.WithPrefix(prefix))...)
		z := zkLocker{l, t.zkNoAuth(prefix)}
		read := make(chan error, 1)
		go func() {
			_, _, err := conn.Get(prefix)
			read <- err
		}()
		select {
		case err = <-read:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return z.explain(fmt.Errorf("zookeeper read %s: %w", prefix, err))
		}
		b.locker = z
		return nil
	}
	return b
}

// zkConnect is zklock.Connect returning when ctx ends: Connect then
// closes its half-made connection first, which waits up to a second for
// a server that accepted the TCP connection and never answers.
func zkConnect(ctx context.Context, servers []string, session time.Duration, opts ...zklock.Option) (*zk.Conn, error) {
	type result struct {
		conn *zk.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := zklock.Connect(ctx, servers, session, opts...)
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-ctx.Done():
		go func() { // not leaked: Connect returns soon after ctx ended
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("%w: zookeeper %v: no session: %w", dlock.ErrUnavailable, servers, context.Cause(ctx))
	}
}

// zkNoAuth returns the explanation of ZooKeeper's refusals for a backend
// whose locks live under prefix.
func (t *target) zkNoAuth(prefix string) func(error) error {
	creds := fmt.Sprintf("(digest user %q)", t.Username)
	if t.Username == "" {
		creds = "(the URL has none: zk://user:password@host:port/path)"
	}
	return func(err error) error {
		switch {
		case errors.Is(err, zk.ErrNoAuth):
			return fmt.Errorf("dlock: not authorized: check the credentials %s and the ACLs of the znodes at %s: %w", creds, prefix, err)
		case errors.Is(err, zk.ErrAuthFailed):
			return fmt.Errorf("dlock: ZooKeeper authentication failed: check the credentials %s: %w", creds, err)
		}
		return err
	}
}

// zkLocker is a zklock.Locker whose errors explain ZooKeeper's refusals:
// a znode's ACL shuts out a client with wrong or no digest credentials
// (ZooKeeper accepts any identity at connect time).
type zkLocker struct {
	*zklock.Locker
	explain func(error) error
}

func (l zkLocker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	lk, err := l.Locker.Acquire(ctx, key, opts...)
	return lk, l.explain(err)
}

func (l zkLocker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	lk, err := l.Locker.TryAcquire(ctx, key, opts...)
	return lk, l.explain(err)
}

func (l zkLocker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	infos, err := l.Locker.List(ctx, prefix)
	return infos, l.explain(err)
}

// openPostgres makes a pgx pool (it connects on first use) and a pglock
// Locker on it. Each connection attempt is bounded by --connect-timeout
// (or the URL's connect_timeout, if shorter). The probe asks whether the
// server takes writes: a read-only server (a hot standby) is refused,
// except by ls, which only reads. ls creates nothing: its Locker does not
// migrate, and a lease table that does not exist lists no locks.
func (t *target) openPostgres(o openOptions) (*backend, error) {
	cfg, err := pgxpool.ParseConfig(t.Conn)
	if err != nil { // parseURL accepted it: only the environment could change
		return nil, &urlError{scrub(fmt.Sprintf("%v %q: %s", errBadURL, t.where, pgParseError(err)), t.secrets)}
	}
	if c := cfg.ConnConfig.ConnectTimeout; c == 0 || c > o.connectTimeout {
		cfg.ConnConfig.ConnectTimeout = o.connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, errors.New(scrub(fmt.Sprintf("postgres %s: %v", t.where, err), t.secrets))
	}
	table := t.Table
	if table == "" {
		table = pglock.DefaultTable
	}
	opts := append(o.lockOptions(), pglock.WithTable(table))
	if t.NoListen {
		opts = append(opts, pglock.WithoutListen())
	}
	if o.readOnly {
		opts = append(opts, pglock.WithoutMigrate())
	}
	l := pglock.New(pool, opts...)
	b := &backend{locker: l, close: pool.Close, where: t.where}
	b.probe = func(ctx context.Context) error {
		var ro string
		if err := pool.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil {
			return err
		}
		if !o.readOnly {
			if ro == "on" {
				return errPgReadOnly
			}
			return nil
		}
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			b.locker = pgNoTable{l}
		}
		return nil
	}
	return b, nil
}

// errPgReadOnly: the server takes no writes.
var errPgReadOnly = errors.New("the server is read-only (transaction_read_only is on: a hot standby?); locks need the primary")

// pgNoTable is the Locker of ls when the lease table does not exist: no
// lock was ever taken there, and ls creates nothing.
type pgNoTable struct{ *pglock.Locker }

func (pgNoTable) List(context.Context, string) ([]dlock.Info, error) { return nil, nil }
