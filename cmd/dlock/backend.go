package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/zklock"
)

// lockInfo is one holder of a held key, one row of `dlock ls`: a key
// held shared or counted shows one row per holder. Mode, Limit, Holders
// and Waiters are the key's: its mode, its number of permits (limited
// keys only), how many hold it, and the clients queued for it where the
// backend keeps a queue (ZooKeeper, Redis), -1 where it cannot tell.
type lockInfo struct {
	Key      string            `json:"key"`
	Mode     string            `json:"mode"`
	Limit    int               `json:"limit,omitempty"`
	Holders  int               `json:"holders"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"-"`
	TTLms    int64             `json:"ttl_ms"`
	Waiters  int               `json:"waiters"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// HeldFor is the time since the holder acquired the key, 0 where the
	// backend does not say (HeldForMs is then -1); Nodes are the redlock
	// nodes holding it for this owner (ls_nodes.go).
	HeldFor   time.Duration `json:"-"`
	HeldForMs int64         `json:"held_for_ms"`
	Nodes     []string      `json:"nodes,omitempty"`
}

// backend is an opened lock service.
type backend struct {
	locker dlock.Locker
	// probe checks the service answers (PING, a read...).
	probe func(ctx context.Context) error
	close func()
	// where is the URL with every secret redacted, for messages.
	where string
	// nodes are the independent nodes of a redlock:// backend, for ls's
	// per-node state (ls_nodes.go); nil for the others.
	nodes []backendNode
	// redis are the Redis servers that hold the leases (redis[s],
	// redis[s]+sentinel: the master; redlock[s]: each node), for check's
	// configuration warnings; nil for the other backends.
	redis []redisServer
}

// redisServer is a Redis server of a backend, named for messages.
type redisServer struct {
	name string
	c    redis.UniversalClient
}

// openOptions are the connection settings shared by the subcommands.
type openOptions struct {
	// connectTimeout bounds connecting and the first probe of the service.
	connectTimeout time.Duration
	// verbose routes the client libraries' own logs to logs, and the
	// lock's events (acquired, renewal failures, lost, released) through
	// dlock's log/slog Observer.
	verbose bool
	logs    io.Writer
	// readOnly is for commands that change nothing (ls): a file backend's
	// directory must exist already (errNoLockDir); it is not created.
	readOnly bool
	// warnSentinels writes to logs a warning for each Sentinel of a
	// Sentinel URL that does not answer and is left out (ls sets it;
	// with verbose every command does). Those that refuse connections
	// are left to ls's own endpoint warnings when it is set.
	warnSentinels bool
	// start is when openBackend began: connecting and the first probe
	// end by start + connectTimeout.
	start time.Time
}

// lockOptions are the options every backend's New gets: with --verbose,
// dlock's log/slog Observer writing to logs.
func (o openOptions) lockOptions() []driver.Option {
	if !o.verbose || o.logs == nil {
		return nil
	}
	return []driver.Option{dlock.WithObserver(dlock.NewSlogObserver(slog.New(slog.NewTextHandler(o.logs, nil))))}
}

// errNoLockDir: a read-only command was given a lock directory that does
// not exist.
var errNoLockDir = errors.New("no such lock directory")

// defaultConnectTimeout is --connect-timeout's default.
const defaultConnectTimeout = 5 * time.Second

// clientIOTimeout is the CLI's Redis clients' read and write timeout for a
// request without a deadline of its own.
const clientIOTimeout = 3 * time.Second

// openBackend parses raw, connects and probes the service within
// o.connectTimeout. URL errors wrap errBadURL.
func openBackend(raw string, o openOptions) (*backend, error) {
	if raw == "" {
		raw = defaultURL()
	}
	if o.connectTimeout <= 0 {
		o.connectTimeout = defaultConnectTimeout
	}
	o.start = time.Now()
	t, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	setClientLogs(o, t.secrets)
	b, err := t.open(o)
	if err != nil {
		return nil, err
	}
	b.close = closeWithin(b.close, closeTimeout)
	if b.probe != nil {
		if err := t.probeService(b, o); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// closeTimeout bounds closing a backend's clients: a client still waiting
// on a server that does not answer (a Sentinel asked for its master) may
// block Close for seconds.
const closeTimeout = 250 * time.Millisecond

// closeWithin makes close return after at most d; the rest of the work
// goes on in the background.
func closeWithin(f func(), d time.Duration) func() {
	return func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			f()
		}()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}

// probeService checks that the service answers, within o.connectTimeout,
// and on failure explains why, within the same bound: the probe, the
// search for a TLS mismatch and closing the clients together end by the
// deadline, whatever the service does. A probe that timed out is not
// followed by a second connection to look for a mismatch. Where a mismatch
// looks like a timeout (rediss:// to a plaintext Redis, which waits for
// the end of a line that never comes; etcd, whose gRPC client retries
// until the deadline) the look starts halfway, while the probe still
// waits.
func (t *target) probeService(b *backend, o openOptions) error {
	if o.start.IsZero() {
		o.start = time.Now()
	}
	deadline := o.start.Add(o.connectTimeout)
	probed := make(chan error, 1)
	go func() { probed <- bounded(o.start, o.connectTimeout, "--connect-timeout", b.probe) }()
	var early <-chan time.Time
	if t.Scheme != "redis" { // a TLS server hangs up on plaintext at once
		tm := time.NewTimer(time.Until(deadline) / 2)
		defer tm.Stop()
		early = tm.C
	}
	var (
		err  error
		look <-chan bool  // the other protocol was found
		diag <-chan error // why a TLS handshake fails, if it does
	)
	for done := false; !done; {
		select {
		case <-early:
			early = nil
			look = t.lookForMismatch(deadline)
			diag = t.diagnoseTLS(deadline)
		case err = <-probed:
			done = true
		}
	}
	if err == nil {
		return nil
	}
	go b.close() // bounded by closeWithin, but nothing to wait for here
	if rerr := redis.Error(nil); errors.As(err, &rerr) {
		// An error reply: the server speaks plaintext Redis (or TLS worked),
		// so there is no mismatch to look for; a look started early ends by
		// the deadline on its own (its channel is buffered).
		return t.explain(err, false, nil)
	}
	var noAnswer errNoAnswer
	if look == nil && !errors.As(err, &noAnswer) {
		look = t.lookForMismatch(deadline)
	}
	if diag == nil && !errors.As(err, &noAnswer) && t.tlsAdvice(err) == "" {
		// The client failed early and its error says nothing of TLS: a
		// server that refused the client's certificate may have reset the
		// connection before the client read the alert saying so, which
		// depends on timing. Look for the alert now.
		diag = t.diagnoseTLS(deadline)
	}
	found := false
	tm := time.NewTimer(time.Until(deadline) + 250*time.Millisecond)
	defer tm.Stop()
	expired := false
	if look != nil {
		select {
		case found = <-look:
		case <-tm.C:
			expired = true
		}
	}
	var tlsErr error
	if diag != nil && !expired {
		select {
		case tlsErr = <-diag:
		case <-tm.C:
		}
	}
	return t.explain(err, found, tlsErr)
}

// bounded runs f with a context that ends d after start, and gives up on
// f shortly after that even if f ignores its context. Timeouts come back
// as errNoAnswer.
func bounded(start time.Time, d time.Duration, flag string, f func(context.Context) error) error {
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(d))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t := time.NewTimer(time.Until(start.Add(d + 250*time.Millisecond)))
	defer t.Stop()
	select {
	case err := <-done:
		var te interface{ Timeout() bool }
		if err != nil && (ctx.Err() != nil || errors.As(err, &te) && te.Timeout()) {
			return errNoAnswer{time.Since(start), d, flag, err}
		}
		return err
	case <-t.C:
		return errNoAnswer{time.Since(start), d, flag, nil}
	}
}

// errNoAnswer: the service did not answer in time.
type errNoAnswer struct {
	after, limit time.Duration
	flag         string
	err          error
}

func (e errNoAnswer) Error() string {
	s := fmt.Sprintf("no answer after %s (%s %s)", e.after.Round(10*time.Millisecond), e.flag, e.limit)
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

func (e errNoAnswer) Unwrap() error { return e.err }

var (
	logsMu   sync.Mutex
	logsDone bool
)

// setClientLogs silences go-redis's and etcd's (gRPC's) own loggers, or
// with --verbose routes them to o.logs with secrets scrubbed. (etcd's zap
// logger and go-zookeeper's are per client: etcdLogger, newZKLogger.)
func setClientLogs(o openOptions, secrets []string) {
	logsMu.Lock()
	defer logsMu.Unlock()
	if logsDone {
		return
	}
	logsDone = true
	if !o.verbose || o.logs == nil {
		redis.SetLogger(discardLogger{})
		grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
		return
	}
	w := &scrubWriter{w: o.logs, secrets: secrets}
	redis.SetLogger(redisLogger{w})
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, w, w))
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

type redisLogger struct{ w io.Writer }

func (l redisLogger) Printf(_ context.Context, format string, args ...any) {
	fmt.Fprintf(l.w, "redis: "+strings.TrimSuffix(format, "\n")+"\n", args...)
}

// etcdLogger is the etcd client's zap logger: none, or warnings to logs.
func etcdLogger(o openOptions, secrets []string) *zap.Logger {
	if !o.verbose || o.logs == nil {
		return zap.NewNop()
	}
	enc := zap.NewDevelopmentEncoderConfig()
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(&scrubWriter{w: o.logs, secrets: secrets}), zapcore.InfoLevel)
	return zap.New(core).Named("etcd-client")
}

// zkLogger is a go-zookeeper connection's logger: silent, or with
// --verbose "zookeeper: ..." lines to logs, secrets scrubbed. It also keeps
// the client's last failure to connect, which Connect does not return, for
// the error when no session came.
type zkLogger struct {
	w io.Writer // nil: silent

	mu          sync.Mutex
	lastFailure string
}

func newZKLogger(o openOptions, secrets []string) *zkLogger {
	l := &zkLogger{}
	if o.verbose && o.logs != nil {
		l.w = &scrubWriter{w: o.logs, secrets: secrets}
	}
	return l
}

func (l *zkLogger) Printf(format string, args ...any) {
	msg := strings.TrimSuffix(fmt.Sprintf(format, args...), "\n")
	if strings.HasPrefix(format, "failed to connect to ") {
		l.mu.Lock()
		l.lastFailure = msg
		l.mu.Unlock()
	}
	if l.w != nil {
		fmt.Fprintf(l.w, "zookeeper: %s\n", msg)
	}
}

func (l *zkLogger) last() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastFailure
}

// scrubWriter removes secrets from everything written through it, and
// escapes control characters other than newline and tab (text from the
// lock service, such as a holder's metadata inside an error, must not
// drive the terminal). Each Write is scrubbed on its own: callers write
// whole lines.
type scrubWriter struct {
	mu      sync.Mutex
	w       io.Writer
	secrets []string
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := io.WriteString(s.w, escapeControls(scrub(string(p), s.secrets))); err != nil {
		return 0, err
	}
	return len(p), nil
}

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
		plain := *t // go-redis's URL: without dlock's TLS files and acks
		plain.CA, plain.Cert, plain.Key = "", "", ""
		plain.Acks, plain.AckTimeout, plain.UnsafeEviction = 0, 0, false
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

// explain turns a failed probe into the message the user sees: where,
// what failed, for a TLS mismatch (found by lookForMismatch) which
// scheme to use instead, and for a failed TLS handshake (in err, or in
// tlsErr found by diagnoseTLS when err hides it) what to change.
func (t *target) explain(err error, mismatch bool, tlsErr error) error {
	what := "not reachable"
	var rerr redis.Error
	var pgErr *pgconn.PgError
	etcdAuth := errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrPermissionDenied)
	if errors.As(err, &rerr) || errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) || errors.As(err, &pgErr) || errors.Is(err, errPgReadOnly) || etcdAuth {
		what = "refused"
	}
	text := err.Error()
	if isSentinelScheme(t.Scheme) {
		text = joinLines(text) // go-redis lists each Sentinel's answer on a line
		// go-redis asks each Sentinel for the master's address and, when
		// none gives one, says they are all unreachable, whatever they
		// answered: name who refused.
		fromSentinels := strings.Contains(text, sentinelsFailed)
		switch {
		case errors.Is(err, redis.Nil):
			// A Sentinel that monitors no master of that name answers nil.
			what, text = "unknown master", fmt.Sprintf("no Sentinel that answered knows a master named %q", t.Master)
		case rerr != nil && fromSentinels:
			what = "refused by the Sentinels"
			text = strings.TrimSpace(text[strings.Index(text, sentinelsFailed)+len(sentinelsFailed):])
			if isAuthError(text) {
				text += " (the Sentinels' password is the URL's sentinel_password)"
			}
		case rerr != nil:
			what = "refused by the master"
		}
	}
	msg := fmt.Sprintf("%s: %s: %s", t.where, what, text)
	switch t.Scheme {
	case "etcd", "etcds":
		msg = "etcd " + msg
	case "zk":
		msg = "zookeeper " + msg
	case "postgres", "postgresql":
		msg = "postgres " + msg
	}
	hint := ""
	if rerr == nil && mismatch {
		hint = t.tlsHint(err)
	}
	if hint == "" && rerr == nil {
		hint = t.tlsAdvice(err)
	}
	if hint == "" && tlsErr != nil {
		if hint = t.tlsAdvice(tlsErr); hint != "" {
			hint = fmt.Sprintf("TLS with %s: %v\n  %s", t.Addrs[0], tlsErr, hint)
		}
	}
	if hint == "" && errors.Is(err, rpctypes.ErrUserEmpty) {
		hint = fmt.Sprintf("the server requires authentication: %s://user:password@host:port", t.Scheme)
	}
	if hint != "" {
		msg += "\n  " + hint
	}
	return errors.New(scrub(msg, t.secrets))
}

// joinLines joins the lines of an error message (errors.Join's, go-redis's
// list of its Sentinels' answers) into one, without repeating a line.
func joinLines(s string) string {
	if !strings.Contains(s, "\n") {
		return s
	}
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || slices.ContainsFunc(lines, func(k string) bool { return strings.HasSuffix(k, l) }) {
			continue // said already (go-redis ends its first line with the first answer)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "; ")
}

// sentinelsFailed starts go-redis's error when no Sentinel gave the
// master's address.
const sentinelsFailed = "all sentinels specified in configuration are unreachable:"

// isAuthError says whether a Redis error reply is about credentials.
func isAuthError(s string) bool {
	return strings.Contains(s, "WRONGPASS") || strings.Contains(s, "NOAUTH") || strings.Contains(s, "NOPERM")
}

func isSentinelScheme(scheme string) bool {
	return scheme == "redis+sentinel" || scheme == "rediss+sentinel"
}

// maxLook bounds a look for a TLS mismatch (and the deadline it is given).
const maxLook = 2 * time.Second

// lookForMismatch starts looking, by deadline, whether the server speaks
// the protocol the URL's scheme does not: plaintext Redis for the Redis
// TLS schemes (rediss://, rediss+cluster://, ...), TLS for their plaintext
// twins and etcd://, and for etcds:// not speaking TLS. It sends no
// credentials. The channel receives whether the other protocol was found;
// nil means there is nothing to look for.
func (t *target) lookForMismatch(deadline time.Time) <-chan bool {
	if limit := time.Now().Add(maxLook); deadline.After(limit) {
		deadline = limit
	}
	if !time.Now().Before(deadline) || len(t.Addrs) == 0 { // postgres: pgx's sslmode handles TLS
		return nil
	}
	addr := t.Addrs[0]
	var look func() bool
	switch {
	case t.Scheme == "etcds":
		look = func() bool { return !speaksTLS(addr, deadline) }
	case isTLSScheme(t.Scheme): // Redis over TLS
		look = func() bool { return speaksPlainRedis(addr, deadline) }
	case tlsSchemeOf(t.Scheme) != "": // redis, etcd, ... in plaintext
		look = func() bool { return speaksTLS(addr, deadline) }
	default:
		return nil
	}
	c := make(chan bool, 1)
	go func() { c <- look() }()
	return c
}

// tlsHint is the advice for a mismatch that lookForMismatch found after
// the probe failed with err; "" when there is none to give.
func (t *target) tlsHint(err error) string {
	addr := t.Addrs[0]
	switch {
	case t.Scheme == "etcds":
		if errorMentionsTLS(err) {
			return fmt.Sprintf("TLS handshake with %s failed: the server does not speak TLS; use etcd:// instead of etcds://", addr)
		}
	case isTLSScheme(t.Scheme):
		return fmt.Sprintf("TLS handshake with %s failed: the server answers plaintext Redis; use %s:// instead of %s://", addr, tlsTwin[t.Scheme], t.Scheme)
	case tlsSchemeOf(t.Scheme) != "":
		return fmt.Sprintf("the server at %s speaks TLS; use %s:// instead of %s://", addr, tlsSchemeOf(t.Scheme), t.Scheme)
	}
	return ""
}

func errorMentionsTLS(err error) bool {
	s := err.Error()
	return strings.Contains(s, "tls") || strings.Contains(s, "TLS") || strings.Contains(s, "handshake")
}

// speaksPlainRedis reports whether addr answers an inline PING in RESP
// by deadline.
func speaksPlainRedis(addr string, deadline time.Time) bool {
	c, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && len(line) > 0 && (line[0] == '+' || line[0] == '-')
}

// speaksTLS reports whether addr completes a TLS handshake by deadline.
// The server's certificate is not checked: nothing is sent over the
// connection, it only tells which protocol the port speaks.
func speaksTLS(addr string, deadline time.Time) bool {
	dialer := &net.Dialer{Deadline: deadline}
	c, err := tls.DialWithDialer(dialer, "tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // protocol detection only
	if err != nil {
		var alert tls.AlertError
		return errors.As(err, &alert) // the server answered in TLS, e.g. asking for a client certificate
	}
	c.Close()
	return true
}

// list returns the holders of the keys under prefix, one row per holder,
// sorted by key then token.
func (b *backend) list(ctx context.Context, prefix string) ([]lockInfo, error) {
	ls, ok := b.locker.(dlock.Lister)
	if !ok {
		return nil, fmt.Errorf("%w: this backend cannot list its locks", dlock.ErrUnsupported)
	}
	infos, err := ls.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []lockInfo
	for _, in := range infos {
		mode := in.Mode
		for _, h := range in.Holders {
			if mode == dlock.Exclusive && h.Mode != dlock.Exclusive { // a backend that sets only the holders'
				mode = h.Mode
			}
		}
		limit := 0
		if mode == dlock.Limited {
			limit = in.Limit
		}
		for _, h := range in.Holders {
			out = append(out, lockInfo{Key: in.Key, Mode: mode.String(), Limit: limit, Holders: len(in.Holders), Owner: h.Owner, Token: h.Token, TTL: h.TTL, HeldFor: h.HeldFor, Waiters: in.Waiters, Metadata: h.Metadata})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Token < out[j].Token
	})
	return out, nil
}

// sentinelGrace is how much longer than the first Sentinel the others
// have to answer answeringSentinels. It is what a hung Sentinel costs
// each command; it must be well above the lag between two healthy
// Sentinels on a loaded host (a quarter of a second is not: a Sentinel
// that answered would be left out, and said not to answer).
const sentinelGrace = time.Second

// silentSentinel is a Sentinel answeringSentinels left out: err is why
// (nil: no reply by the time it stopped waiting, after waited).
type silentSentinel struct {
	addr   string
	err    error
	waited time.Duration
}

// dialFailed reports that s could not even be connected to (refused, no
// route): ls's endpointWarnings names those already.
func (s silentSentinel) dialFailed() bool {
	var op *net.OpError
	return errors.As(s.err, &op) && op.Op == "dial"
}

// sentinelWarnings is a line for each Sentinel left out, naming its
// address (never a password: Sentinel addresses hold none, and the
// caller's writer scrubs the URL's secrets) and why; up of all Sentinels
// are used. skipDialFailed leaves out those that refused connections.
func sentinelWarnings(silent []silentSentinel, up, all int, skipDialFailed bool) []string {
	var out []string
	for _, s := range silent {
		if skipDialFailed && s.dialFailed() {
			continue
		}
		why := fmt.Sprintf("no reply to PING within %v", s.waited.Round(10*time.Millisecond))
		if s.err != nil {
			why = oneLine(s.err.Error())
		}
		out = append(out, fmt.Sprintf("warning: sentinel %s does not answer (%s); going on with %d/%d sentinels", s.addr, why, up, all))
	}
	return out
}

// answeringSentinels is opt.SentinelAddrs without the Sentinels that do
// not answer, and those left out. go-redis asks every Sentinel of its
// list for the master at once and waits for the last of them, so a single
// hung Sentinel (its port accepts, it never answers: a stopped process, a
// black-holed host) would cost every command its whole --connect-timeout
// and fail it, although the others, a quorum, answer. Each Sentinel is
// sent a PING, all at once, until deadline; once the first answers, the
// others have as long again plus sentinelGrace. Any reply counts as an
// answer (an error reply too: go-redis then reports it, a wrong
// sentinel_password say). When none answers, the list is returned whole,
// for go-redis to report on, and none is said to be left out.
func answeringSentinels(opt *redis.FailoverOptions, deadline time.Time) (keep []string, silent []silentSentinel) {
	addrs := opt.SentinelAddrs
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	type answer struct {
		i   int
		err error // nil or a reply: answered
		ok  bool
	}
	answers := make(chan answer, len(addrs)) // buffered: late senders do not block
	start := time.Now()
	for i, a := range addrs {
		go func() {
			c := redis.NewSentinelClient(&redis.Options{
				Addr: a, Dialer: opt.Dialer, TLSConfig: opt.TLSConfig,
				Username: opt.SentinelUsername, Password: opt.SentinelPassword,
				DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
				ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1,
				// One dial: a refusal is an answer of sorts (that
				// Sentinel is left out at once, and named as refusing);
				// go-redis would dial again for half a second.
				DialerRetries: 1,
			})
			defer c.Close()
			err := c.Ping(ctx).Err()
			var rerr redis.Error
			answers <- answer{i, err, err == nil || errors.As(err, &rerr)}
		}()
	}
	ok := make([]bool, len(addrs))
	errs := make([]error, len(addrs)) // why each that failed did
	n := 0
	var grace <-chan time.Time
wait:
	for range addrs {
		select {
		case a := <-answers:
			if a.ok {
				ok[a.i] = true
				if n++; n == 1 {
					tm := time.NewTimer(time.Since(start) + sentinelGrace)
					defer tm.Stop()
					grace = tm.C
				}
			} else {
				errs[a.i] = a.err
			}
		case <-grace:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	if n == 0 {
		return addrs, nil
	}
	waited := time.Since(start)
	keep = make([]string, 0, n)
	for i, a := range addrs {
		if ok[i] {
			keep = append(keep, a)
			continue
		}
		err := errs[i]
		var te interface{ Timeout() bool }
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout() && !(silentSentinel{err: err}).dialFailed() {
			err = nil // no reply in time, as for those still waiting
		}
		silent = append(silent, silentSentinel{addr: a, err: err, waited: waited})
	}
	return keep, silent
}
