package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/zklock"
)

// target is a parsed lock-service URL: everything needed to connect, with
// nothing opened yet. parseURL is pure, so it can be fuzzed, and
// target.URL renders it back (parseURL(t.URL()) gives t again).
type target struct {
	Scheme string
	// Dir is the lease directory (file).
	Dir string
	// Addrs are host:port of the servers: one Redis, the Cluster nodes
	// to start from, the Sentinels, the Redlock nodes, the etcd endpoints
	// or the ZooKeeper ensemble.
	Addrs              []string
	Username, Password string
	// DB is the Redis database (redis[s], redis[s]+sentinel, redlock[s]).
	DB int
	// Master is the Sentinel master name (redis+sentinel).
	Master                             string
	SentinelUsername, SentinelPassword string
	// Prefix is the etcd key prefix, "" or ending in "/".
	Prefix string
	// CA is a PEM file of CA certificates, Cert and Key a PEM client
	// certificate and its key (TLS schemes: ?ca=, ?cert=, ?key=).
	CA, Cert, Key string
	// TLS is set for the TLS schemes (rediss, rediss+cluster,
	// rediss+sentinel, redlocks, etcds).
	TLS bool
	// Options are go-redis URL options (redis[s], redis[s]+cluster:
	// dial_timeout, ...).
	Options url.Values
	// Chroot is the znode the ZooKeeper locks live under (zk): an absolute
	// path, "" for zklock.DefaultPrefix.
	Chroot string
	// SessionTimeout is the ZooKeeper session timeout asked for (zk:
	// ?session_timeout=), 0 for defaultSessionTimeout.
	SessionTimeout time.Duration
	// Conn is the libpq URL handed to pgxpool.ParseConfig (postgres,
	// postgresql), password included, without dlock's own options.
	Conn string
	// Table is the lease table (postgres: ?table=), "" for
	// pglock.DefaultTable.
	Table string
	// NoListen turns LISTEN/NOTIFY wake-ups off (postgres: ?listen=off).
	NoListen bool
	// Acks is the number of replicas that must acknowledge each
	// acquisition and renewal (redis[s], redis[s]+sentinel: ?acks=), 0 for
	// none; AckTimeout their timeout (?ack_timeout=), 0 for
	// redislock.DefaultAckTimeout.
	Acks       int
	AckTimeout time.Duration
	// UnsafeEviction accepts a Redis that may evict keys (redis-family
	// schemes: ?unsafe_eviction=true), which is otherwise refused.
	UnsafeEviction bool

	// where is the URL with every secret redacted, for messages.
	where string
	// secrets are the strings to scrub from anything printed.
	secrets []string
}

// errBadURL marks URL errors (exit status 2).
var errBadURL = errors.New("bad URL")

// schemes lists the supported URL schemes, for error messages.
var schemes = []string{"file", "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel", "redlock", "redlocks", "etcd", "etcds", "zk", "postgres", "postgresql"}

// redactedMark replaces secrets in printed URLs and messages.
const redactedMark = "xxxxx"

// urlWithheldEnv is set in the environment of a dlock run's CMD when the
// DLOCK_URL it would have inherited held a secret and was left out: a
// dlock started by CMD must then be given its URL, not fall back to the
// local file backend (a different lock service) without a word.
const urlWithheldEnv = "DLOCK_URL_WITHHELD"

// urlWithheld is what defaultURL returns under urlWithheldEnv: parseURL
// refuses it with errURLWithheld's explanation.
const urlWithheld = "withheld:"

// defaultURL is $DLOCK_URL or a file backend in the per-user state dir.
func defaultURL() string {
	if u := os.Getenv("DLOCK_URL"); u != "" {
		return u
	}
	if os.Getenv(urlWithheldEnv) != "" {
		return urlWithheld
	}
	return "file://" + stateDir()
}

// stateDir is $XDG_STATE_HOME/dlock, ~/.local/state/dlock, or a per-user
// directory under the system temp dir.
func stateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "dlock")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" && h != "/" {
		return filepath.Join(h, ".local", "state", "dlock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("dlock-%d", os.Getuid()))
}

// urlError is a bad URL: it wraps errBadURL and its text is already free of
// the URL's secrets.
type urlError struct{ msg string }

func (e *urlError) Error() string { return e.msg }
func (e *urlError) Unwrap() error { return errBadURL }

func badURL(raw, format string, args ...any) error {
	msg := fmt.Sprintf("%v %q: %s", errBadURL, redact(raw), fmt.Sprintf(format, args...))
	return &urlError{scrub(msg, secretsOf(raw))}
}

// plainParams are the query parameters whose values are printed as
// written: dlock's own, go-redis's and libpq's (pgx's) options that hold no
// secret. Any other parameter's value, a misspelt ?pasword= or ?pw= among
// them, is redacted like a password.
var plainParams = map[string]bool{
	// dlock
	"ca": true, "cert": true, "key": true, "acks": true, "ack_timeout": true, "unsafe_eviction": true,
	"sentinel_username": true, "session_timeout": true, "table": true, "listen": true,
	// go-redis
	"db": true, "addr": true, "client_name": true, "protocol": true, "dial_timeout": true,
	"read_timeout": true, "write_timeout": true, "pool_fifo": true, "pool_size": true,
	"pool_timeout": true, "min_idle_conns": true, "max_idle_conns": true,
	"max_active_conns": true, "conn_max_idle_time": true, "conn_max_lifetime": true,
	"idle_timeout": true, "max_retries": true, "min_retry_backoff": true,
	"max_retry_backoff": true, "context_timeout_enabled": true, "skip_verify": true,
	"max_redirects": true, "read_only": true, "route_by_latency": true,
	"route_randomly": true, "unstable_resp3": true, "identity_suffix": true,
	"disable_identity": true, "read_buffer_size": true, "write_buffer_size": true,
	// libpq and pgx
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true,
	"sslmode": true, "sslrootcert": true, "sslcert": true, "sslsni": true,
	"sslnegotiation": true, "connect_timeout": true, "application_name": true,
	"fallback_application_name": true, "target_session_attrs": true, "search_path": true,
	"options": true, "default_query_exec_mode": true, "statement_cache_capacity": true,
	"description_cache_capacity": true, "min_read_buffer_size": true,
	"pool_max_conns": true, "pool_min_conns": true, "pool_min_idle_conns": true,
	"pool_max_conn_lifetime": true, "pool_max_conn_idle_time": true,
	"pool_health_check_period": true, "pool_max_conn_lifetime_jitter": true,
	"timezone": true, "client_encoding": true, "datestyle": true,
}

// plainRuntimeParams are PostgreSQL settings a postgres:// URL commonly
// passes to the server (pgx sends unknown parameters as run-time
// settings); with every name ending in "_timeout" they are plain.
var plainRuntimeParams = map[string]bool{
	"keepalives": true, "keepalives_idle": true, "keepalives_interval": true,
	"keepalives_count": true, "work_mem": true, "maintenance_work_mem": true,
	"default_transaction_isolation": true, "default_transaction_read_only": true,
	"jit": true, "lc_messages": true, "role": true, "intervalstyle": true,
}

// isSecretParam reports whether a query parameter's value is to be kept
// secret: that of any parameter but the known plain ones (?key= names a
// private key's file, which is not secret; its contents are, and are never
// printed). A name that looks like a credential's is secret whatever its
// ending.
func isSecretParam(name string) bool {
	if plainParams[name] {
		return false
	}
	n := strings.ToLower(name)
	for _, w := range []string{"pass", "pw", "secret", "token", "auth", "cred"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return !plainRuntimeParams[n] && !strings.HasSuffix(n, "_timeout")
}

// redact returns raw with every secret replaced by xxxxx: the password of
// the userinfo and the value of every query parameter but the known plain
// ones (plainParams). Unparsable URLs are redacted best effort:
// everything between "://" and the last "@" goes.
func redact(raw string) string {
	u, err := parseHostList(raw)
	if err != nil || strayAt(raw, u) {
		return redactRaw(raw)
	}
	if u.Opaque != "" && strings.Contains(u.Opaque, "@") {
		u.Opaque = redactedMark + u.Opaque[strings.LastIndexByte(u.Opaque, '@'):]
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redactedMark)
		}
	}
	u.RawQuery = redactQuery(u.RawQuery)
	return u.String()
}

// strayAt reports an "@" that is not the end of a userinfo: a password with
// an unescaped "/", "?" or "#" parses as host, path or query, and must not
// be printed as such.
func strayAt(raw string, u *url.URL) bool {
	if u.Scheme == "file" || u.User != nil {
		return false
	}
	_, rest, ok := strings.Cut(raw, ":")
	return ok && strings.Contains(rest, "@")
}

// redactQuery blanks secret parameters in a raw query, keeping the rest as
// written.
func redactQuery(q string) string {
	if q == "" {
		return q
	}
	parts := strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' })
	for i, p := range parts {
		name, _, hasValue := strings.Cut(p, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if hasValue && isSecretParam(name) {
			parts[i] = p[:strings.IndexByte(p, '=')+1] + redactedMark
		}
	}
	return strings.Join(parts, "&")
}

// redactRaw redacts a URL that does not parse.
func redactRaw(raw string) string {
	s := raw
	if i := strings.Index(s, "://"); i >= 0 {
		if at := strings.LastIndexByte(s, '@'); at > i+3 {
			s = s[:i+3] + redactedMark + s[at:]
		}
	} else if at := strings.LastIndexByte(s, '@'); at >= 0 {
		if c := strings.IndexByte(s, ':'); c >= 0 && c < at {
			s = s[:c+1] + redactedMark + s[at:]
		}
	}
	if q := strings.IndexByte(s, '?'); q >= 0 {
		rest := s[q+1:]
		frag := ""
		if h := strings.IndexByte(rest, '#'); h >= 0 {
			rest, frag = rest[:h], rest[h:]
		}
		s = s[:q+1] + redactQuery(rest) + frag
	}
	return s
}

// secretsOf finds the secrets in raw, in decoded and in raw form, with the
// same rules as redact (plus the best-effort ones, whether or not raw
// parses).
func secretsOf(raw string) []string {
	var out []string
	add := func(s string) {
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(s); err == nil {
			out = append(out, d)
		}
	}
	if u, err := url.Parse(raw); err == nil {
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				out = append(out, p)
			}
		}
		if u.Opaque != "" {
			if at := strings.LastIndexByte(u.Opaque, '@'); at >= 0 {
				add(u.Opaque[:at])
			}
		}
	}
	// Best effort: the text between the scheme and the last "@", and the
	// part of it after the first ":" (the password when it parses).
	if _, rest, ok := strings.Cut(raw, ":"); ok {
		rest = strings.TrimPrefix(rest, "//")
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			ui := rest[:at]
			add(ui)
			if _, pw, ok := strings.Cut(ui, ":"); ok {
				add(pw)
			}
		}
	}
	if _, q, ok := strings.Cut(raw, "?"); ok {
		q, _, _ = strings.Cut(q, "#")
		for _, p := range strings.FieldsFunc(q, func(r rune) bool { return r == '&' || r == ';' }) {
			name, v, ok := strings.Cut(p, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			if ok && isSecretParam(name) {
				add(v)
			}
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	// Longest first, so that a secret containing another is scrubbed whole.
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// minScrub is the shortest secret scrubbed from free text: shorter ones
// would mangle every message (a password "1" is in "127.0.0.1") and are
// redacted from URLs structurally only.
const minScrub = 3

// scrub replaces every secret in s with xxxxx.
func scrub(s string, secrets []string) string {
	for range len(s) + 1 { // each pass removes at least one non-'x' byte
		changed := false
		for _, sec := range secrets {
			if len(sec) < minScrub || strings.Trim(sec, "x") == "" {
				continue
			}
			if strings.Contains(s, sec) {
				s = strings.ReplaceAll(s, sec, redactedMark)
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	return s
}

// parseHostList is url.Parse, except that a comma-separated host list
// with IPv6 literals ("[::1]:26379,[::1]:26380"), which url.Parse refuses
// ("invalid IP-literal"), is parsed in place of a placeholder host and
// put back in Host; each address is checked by addrList.
func parseHostList(raw string) (*url.URL, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return url.Parse(raw)
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	at := strings.LastIndexByte(authority, '@')
	hosts := authority[at+1:]
	if !strings.Contains(hosts, ",") || !strings.Contains(hosts, "[") {
		return url.Parse(raw)
	}
	const placeholder = "dlock-host-list.invalid"
	u, err := url.Parse(scheme + "://" + authority[:at+1] + placeholder + rest[end:])
	if err != nil || u.Host != placeholder {
		return url.Parse(raw)
	}
	// Each address as url.Parse reads a lone host: a zone's "%25" is
	// decoded once, as it is without a list.
	list := strings.Split(hosts, ",")
	for i, h := range list {
		if h == "" {
			continue // addrList says so
		}
		hu, err := url.Parse("x://" + h)
		if err != nil || hu.User != nil || hu.Path != "" || hu.RawQuery != "" {
			return url.Parse(raw)
		}
		list[i] = hu.Host
	}
	u.Host = strings.Join(list, ",")
	return u, nil
}

// parseURL parses a lock-service URL. It opens nothing. Errors wrap
// errBadURL and never contain the URL's secrets.
func parseURL(raw string) (*target, error) {
	if raw == urlWithheld {
		return nil, &urlError{fmt.Sprintf("%v: no --url given, and the outer dlock run withheld its DLOCK_URL from this command because it holds a password; pass --url or --url-file", errBadURL)}
	}
	u, err := parseHostList(raw)
	if err != nil {
		// url.Parse quotes pieces of its input, which may be pieces of a
		// password: explain with the redacted URL's error instead.
		hint := ""
		if strings.Contains(raw, "@") {
			hint = " (percent-encode / ? # @ % in passwords)"
		}
		if _, err := url.Parse(redactRaw(raw)); err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, badURL(raw, "%v%s", err, hint)
		}
		return nil, badURL(raw, "cannot parse it%s", hint)
	}
	if u.Scheme == "" {
		return nil, badURL(raw, "no scheme; supported: %s", strings.Join(schemes, ", "))
	}
	if !slices.Contains(schemes, u.Scheme) {
		return nil, badURL(raw, "unknown scheme %q; supported: %s", u.Scheme, strings.Join(schemes, ", "))
	}
	if strayAt(raw, u) {
		return nil, badURL(raw, "an \"@\" outside user:password@host (percent-encode / ? # @ %% in passwords)")
	}
	if u.Fragment != "" || strings.HasSuffix(raw, "#") {
		return nil, badURL(raw, "unexpected #fragment")
	}
	t := &target{Scheme: u.Scheme, TLS: isTLSScheme(u.Scheme), where: redact(raw), secrets: secretsOf(raw)}
	if u.User != nil {
		t.Username = u.User.Username()
		t.Password, _ = u.User.Password()
	}
	switch u.Scheme {
	case "file":
		err = t.parseFile(raw, u)
	case "redis", "rediss":
		err = t.parseRedis(raw, u)
	case "redis+cluster", "rediss+cluster":
		err = t.parseCluster(raw, u)
	case "redis+sentinel", "rediss+sentinel":
		err = t.parseSentinel(raw, u)
	case "redlock", "redlocks":
		err = t.parseRedlock(raw, u)
	case "etcd", "etcds":
		err = t.parseEtcd(raw, u)
	case "zk":
		err = t.parseZK(raw, u)
	case "postgres", "postgresql":
		err = t.parsePostgres(raw, u)
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// query returns u's parameters, refusing unknown and repeated ones.
func query(raw string, u *url.URL, known ...string) (url.Values, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, badURL(raw, "query: %v", err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range q {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range names {
		switch {
		case !slices.Contains(known, k) && len(known) == 0:
			return nil, badURL(raw, "%s URLs take no ?%s= option", u.Scheme, k)
		case !slices.Contains(known, k):
			return nil, badURL(raw, "unknown option ?%s= (known: %s)", k, strings.Join(known, ", "))
		case len(q[k]) > 1:
			return nil, badURL(raw, "option ?%s= given %d times", k, len(q[k]))
		}
	}
	return q, nil
}

func (t *target) parseFile(raw string, u *url.URL) error {
	dir := u.Path
	if u.Opaque != "" { // file:relative/dir
		d, err := url.PathUnescape(u.Opaque)
		if err != nil {
			return badURL(raw, "directory path: %v", err)
		}
		dir = d
	}
	switch {
	case u.User != nil:
		return badURL(raw, "file URLs take no user or password")
	case u.Host != "" && u.Host != "localhost":
		return badURL(raw, "file URLs name a local directory: use file:///absolute/path (host %q given)", u.Host)
	case dir == "":
		return badURL(raw, "missing directory path")
	case strings.IndexByte(dir, 0) >= 0:
		return badURL(raw, "directory path contains a NUL byte")
	}
	if _, err := query(raw, u); err != nil {
		return err
	}
	t.Dir = dir
	return nil
}

// validHost accepts DNS names and IP literals.
func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// hostPort checks one host:port and returns it in canonical form.
func hostPort(raw, hp string) (string, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", badURL(raw, "address %q is not host:port", hp)
	}
	if host == "" {
		return "", badURL(raw, "address %q has no host", hp)
	}
	if !validHost(host) {
		return "", badURL(raw, "address %q: %q is not a host name or IP address", hp, host)
	}
	if a, err := netip.ParseAddr(host); strings.HasPrefix(hp, "[") && (err != nil || !a.Is6()) {
		return "", badURL(raw, "address %q: brackets hold an IPv6 address, not %q", hp, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 || port != strconv.Itoa(p) {
		return "", badURL(raw, "port %q is not a number in 1-65535", port)
	}
	return net.JoinHostPort(host, port), nil
}

// addrList checks a comma-separated list of host:port.
func addrList(raw, hosts, what string) ([]string, error) {
	if hosts == "" {
		return nil, badURL(raw, "no %s addresses", what)
	}
	var out []string
	for _, a := range strings.Split(hosts, ",") {
		if a == "" {
			return nil, badURL(raw, "empty %s address in the list %q", what, hosts)
		}
		hp, err := hostPort(raw, a)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, hp) {
			return nil, badURL(raw, "address %q is listed twice", a)
		}
		out = append(out, hp)
	}
	return out, nil
}

func parseDB(raw, s string) (int, error) {
	db, err := strconv.Atoi(s)
	if err != nil || db < 0 {
		return 0, badURL(raw, "database %q is not a non-negative number", s)
	}
	return db, nil
}

// parseRedis checks redis[s]://[user:pass@]host[:port][/db][?go-redis
// options], and for rediss ?ca=, ?cert= and ?key=.
func (t *target) parseRedis(raw string, u *url.URL) error {
	if u.Opaque != "" || u.Host == "" {
		return badURL(raw, "no host: %s://[user:pass@]host:port[/db]", u.Scheme)
	}
	if strings.Contains(u.Host, ",") {
		return badURL(raw, "%s:// takes one address (redis+cluster:// for a Cluster, redlock:// for several masters, redis+sentinel:// for Sentinel)", u.Scheme)
	}
	hp := u.Host
	if u.Port() == "" && !strings.HasSuffix(hp, ":") {
		hp = net.JoinHostPort(u.Hostname(), "6379")
	}
	addr, err := hostPort(raw, hp)
	if err != nil {
		return err
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badURL(raw, "query: %v", err)
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	if err := t.takeAcks(raw, q); err != nil {
		return err
	}
	if err := t.takeUnsafeEviction(raw, q); err != nil {
		return err
	}
	// go-redis checks its own options, without dlock's TLS files and acks.
	gu := *u
	gu.RawQuery = q.Encode()
	opt, err := redis.ParseURL(gu.String())
	if err != nil {
		return badURL(raw, "%s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	if opt.DB < 0 {
		return badURL(raw, "database %d is negative", opt.DB)
	}
	rt := clientIOTimeout
	if q.Has("read_timeout") {
		rt = opt.ReadTimeout
	}
	if err := t.checkAckTimeout(raw, rt); err != nil {
		return err
	}
	q.Del("db") // in DB now
	t.Addrs, t.DB = []string{addr}, opt.DB
	if len(q) > 0 {
		t.Options = q
	}
	return nil
}

// parseSentinel checks redis[s]+sentinel://[user:pass@]h1:p1,h2:p2/master[/db]
// [?sentinel_username=U&sentinel_password=P], and for rediss+sentinel
// ?ca=, ?cert= and ?key=, used with the Sentinels and the master alike.
func (t *target) parseSentinel(raw string, u *url.URL) error {
	addrs, err := addrList(raw, u.Host, "sentinel")
	if err != nil {
		return err
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if parts[0] == "" {
		return badURL(raw, "missing master name: %s://h1:p1,h2:p2/MASTER[/DB]", u.Scheme)
	}
	if len(parts) > 2 {
		return badURL(raw, "path has too many parts: want /MASTER[/DB]")
	}
	if len(parts) == 2 {
		if t.DB, err = parseDB(raw, parts[1]); err != nil {
			return err
		}
	}
	known, err := tlsKnown(raw, u)
	if err != nil {
		return err
	}
	q, err := query(raw, u, append(known, "sentinel_username", "sentinel_password", "acks", "ack_timeout", "unsafe_eviction")...)
	if err != nil {
		return err
	}
	if err := t.takeUnsafeEviction(raw, q); err != nil {
		return err
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	if err := t.takeAcks(raw, q); err != nil {
		return err
	}
	if err := t.checkAckTimeout(raw, clientIOTimeout); err != nil {
		return err
	}
	t.Addrs, t.Master = addrs, parts[0]
	t.SentinelUsername, t.SentinelPassword = q.Get("sentinel_username"), q.Get("sentinel_password")
	return nil
}

// takeAcks takes ?acks=N (0 to redislock.MaxReplicaAcks) and
// ?ack_timeout=D (above 0, at most redislock.MaxAckTimeout, and below the
// client's read timeout; only with ?acks=) out of q.
func (t *target) takeAcks(raw string, q url.Values) error {
	for _, k := range []string{"acks", "ack_timeout"} {
		if len(q[k]) > 1 {
			return badURL(raw, "option ?%s= given %d times", k, len(q[k]))
		}
	}
	if q.Has("acks") {
		s := q.Get("acks")
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > redislock.MaxReplicaAcks {
			return badURL(raw, "?acks=%q is not a replica count from 0 to %d", s, redislock.MaxReplicaAcks)
		}
		t.Acks = n
	}
	if q.Has("ack_timeout") {
		s := q.Get("ack_timeout")
		if !q.Has("acks") {
			return badURL(raw, "?ack_timeout= needs ?acks=N")
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return badURL(raw, "?ack_timeout=%q is not a duration (500ms, 2s)", s)
		}
		if d <= 0 || d > redislock.MaxAckTimeout {
			return badURL(raw, "?ack_timeout=%s is out of range (0, %v]", d, redislock.MaxAckTimeout)
		}
		t.AckTimeout = d
	}
	q.Del("acks")
	q.Del("ack_timeout")
	return nil
}

// takeUnsafeEviction takes ?unsafe_eviction=true|false (also 1|0) out of
// q: accept a Redis whose maxmemory-policy may evict lock keys.
func (t *target) takeUnsafeEviction(raw string, q url.Values) error {
	if !q.Has("unsafe_eviction") {
		return nil
	}
	if len(q["unsafe_eviction"]) > 1 {
		return badURL(raw, "option ?unsafe_eviction= given %d times", len(q["unsafe_eviction"]))
	}
	v, err := strconv.ParseBool(q.Get("unsafe_eviction"))
	if err != nil {
		return badURL(raw, "?unsafe_eviction=%q is not true or false", q.Get("unsafe_eviction"))
	}
	t.UnsafeEviction = v
	q.Del("unsafe_eviction")
	return nil
}

// checkAckTimeout refuses acknowledgement whose timeout is not below the
// client's read timeout rt (< 0: none; 0: go-redis's default, 3s): WAIT's
// reply would never be read.
func (t *target) checkAckTimeout(raw string, rt time.Duration) error {
	if rt == 0 {
		rt = 3 * time.Second
	}
	at := t.AckTimeout
	if at == 0 {
		at = redislock.DefaultAckTimeout
	}
	if t.Acks > 0 && rt > 0 && at >= rt {
		return badURL(raw, "?ack_timeout=%s must be below the read timeout (%s)", at, rt)
	}
	return nil
}

// parseRedlock checks redlock[s]://[user:pass@]h1:p1,h2:p2,h3:p3[/db], and
// for redlocks (TLS to every node) ?ca=, ?cert= and ?key=.
func (t *target) parseRedlock(raw string, u *url.URL) error {
	if u.Host == "" {
		return badURL(raw, "no node addresses: %s://h1:p1,h2:p2,h3:p3", u.Scheme)
	}
	addrs, err := addrList(raw, u.Host, "node")
	if err != nil {
		return err
	}
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		if t.DB, err = parseDB(raw, p); err != nil {
			return err
		}
	}
	known, err := tlsKnown(raw, u)
	if err != nil {
		return err
	}
	q, err := query(raw, u, append(known, "unsafe_eviction")...)
	if err != nil {
		return err
	}
	if err := t.takeUnsafeEviction(raw, q); err != nil {
		return err
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	t.Addrs = addrs
	return nil
}

// parseEtcd checks etcd[s]://[user:pass@]h1:p1[,h2:p2][/prefix], and for
// etcds ?ca=FILE, ?cert=FILE&key=FILE.
func (t *target) parseEtcd(raw string, u *url.URL) error {
	if u.Host == "" {
		return badURL(raw, "no endpoints: %s://h1:p1[,h2:p2]", u.Scheme)
	}
	addrs, err := addrList(raw, u.Host, "endpoint")
	if err != nil {
		return err
	}
	known, err := tlsKnown(raw, u)
	if err != nil {
		return err
	}
	q, err := query(raw, u, known...)
	if err != nil {
		return err
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	prefix := strings.TrimPrefix(u.Path, "/")
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	t.Addrs, t.Prefix = addrs, prefix
	return nil
}

// ZooKeeper defaults: the client port, and the session timeout asked for
// when the URL gives none (the servers grant 2 to 20 ticks by default,
// 4s to 40s with the usual tickTime of 2s).
const (
	defaultZKPort         = "2181"
	defaultSessionTimeout = 10 * time.Second
)

// parseZK checks zk://[user:pass@]h1:p1[,h2:p2][/path][?session_timeout=D].
// A server without a port gets 2181. The path is the znode the locks live
// under (default zklock.DefaultPrefix). user:pass is ZooKeeper digest
// auth, and the ACL of every znode dlock creates: both or neither.
func (t *target) parseZK(raw string, u *url.URL) error {
	if u.Opaque != "" || u.Host == "" {
		return badURL(raw, "no servers: zk://[user:pass@]h1:p1[,h2:p2][/path]")
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		if h != "" && (!strings.Contains(h, ":") || strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]")) {
			hosts[i] = h + ":" + defaultZKPort
		}
	}
	addrs, err := addrList(raw, strings.Join(hosts, ","), "server")
	if err != nil {
		return err
	}
	if u.User != nil {
		pw, hasPw := u.User.Password()
		switch user := u.User.Username(); {
		case user == "":
			return badURL(raw, "digest auth needs a user name: zk://user:password@host:port")
		case strings.Contains(user, ":"):
			return badURL(raw, "the digest user name contains \":\"")
		case !hasPw || pw == "":
			return badURL(raw, "a user name without a password: ZooKeeper digest auth needs zk://user:password@host:port")
		}
	}
	chroot := u.Path
	if chroot == "/" {
		chroot = ""
	}
	if chroot != "" {
		if why := badZNodePath(chroot); why != "" {
			return badURL(raw, "path %q: %s", chroot, why)
		}
	}
	q, err := query(raw, u, "session_timeout")
	if err != nil {
		return err
	}
	var session time.Duration
	if q.Has("session_timeout") {
		s := q.Get("session_timeout")
		d, err := time.ParseDuration(s)
		if err != nil {
			return badURL(raw, "?session_timeout=%q is not a duration (10s, 1m)", s)
		}
		if d < zklock.MinSessionTimeout || d > dlock.MaxTTL {
			return badURL(raw, "?session_timeout=%s is out of range [%v, %v]", d, zklock.MinSessionTimeout, dlock.MaxTTL)
		}
		session = d
	}
	t.Addrs, t.Chroot, t.SessionTimeout = addrs, chroot, session
	return nil
}

// badZNodePath says why p is not an absolute ZooKeeper path that dlock
// can put locks under ("" if it is): the rules of ZooKeeper's
// PathUtils.validatePath, and "/zookeeper", which the server reserves.
func badZNodePath(p string) string {
	switch {
	case !strings.HasPrefix(p, "/"):
		return "not an absolute znode path"
	case strings.HasSuffix(p, "/"):
		return "a znode path does not end with \"/\""
	}
	for _, seg := range strings.Split(p[1:], "/") {
		switch seg {
		case "":
			return "empty znode name (\"//\")"
		case ".", "..":
			return fmt.Sprintf("%q is not a znode name (ZooKeeper paths are never relative)", seg)
		}
		for i := 0; i < len(seg); {
			r, w := utf8.DecodeRuneInString(seg[i:])
			switch {
			case r == utf8.RuneError && w <= 1:
				return "not valid UTF-8"
			case r < 0x20 || r >= 0x7F && r <= 0x9F || r >= 0xD800 && r <= 0xF8FF || r >= 0xFFF0:
				return fmt.Sprintf("ZooKeeper does not accept the character %U in a znode name", r)
			}
			i += w
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return "/zookeeper is reserved by ZooKeeper"
	}
	return ""
}

// pgTableRE is what pglock.WithTable accepts (pglock's identRE): a
// lower-case identifier, optionally schema-qualified, at most 48 bytes a
// part.
var pgTableRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}(\.[a-z_][a-z0-9_]{0,47})?$`)

// parsePostgres checks a libpq URL,
// postgres[ql]://[user[:pass]@][h1[:p1][,h2[:p2]]][/db][?param=...], with
// dlock's own options taken out of the query: ?table= (the lease table)
// and ?listen=off (no LISTEN/NOTIFY, waiters poll). The rest goes to
// pgxpool.ParseConfig as given (sslmode, connect_timeout, pool_max_conns,
// default_query_exec_mode, ...).
func (t *target) parsePostgres(raw string, u *url.URL) error {
	if u.Opaque != "" {
		return badURL(raw, "want %s://[user:pass@]host:port/db", u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badURL(raw, "query: %v", err)
	}
	for _, k := range []string{"acks", "ack_timeout"} {
		// pgx would send them to the server as runtime parameters, which
		// it refuses only once connected: say so here, as other schemes do.
		if q.Has(k) {
			return badURL(raw, "%s URLs take no ?%s= option (replica acknowledgement is for redis[s]:// and redis[s]+sentinel://)", u.Scheme, k)
		}
	}
	for _, k := range []string{"table", "listen"} {
		if len(q[k]) > 1 {
			return badURL(raw, "option ?%s= given %d times", k, len(q[k]))
		}
	}
	if q.Has("table") {
		t.Table = q.Get("table")
		if !pgTableRE.MatchString(t.Table) {
			return badURL(raw, "?table=%q: want a lower-case identifier, optionally schema.table, at most 48 bytes a part", t.Table)
		}
	}
	if q.Has("listen") {
		switch l := q.Get("listen"); l {
		case "on":
		case "off":
			t.NoListen = true
		default:
			return badURL(raw, "?listen=%q: want on or off", l)
		}
	}
	q.Del("table")
	q.Del("listen")
	c := *u
	c.RawQuery, c.ForceQuery = q.Encode(), false
	t.Conn = c.String()
	if _, err := pgxpool.ParseConfig(t.Conn); err != nil {
		return badURL(raw, "%s", pgParseError(err))
	}
	return nil
}

// pgParseError is pgx's reason for refusing a connection string, without
// the string itself.
func pgParseError(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}

// URL renders t as a URL that parses back to t, password included: it is
// for handing to client libraries, never for printing (use t.where).
func (t *target) URL() string {
	u := &url.URL{Scheme: t.Scheme}
	if t.Scheme == "file" {
		if strings.HasPrefix(t.Dir, "/") {
			return "file://" + (&url.URL{Path: t.Dir}).EscapedPath()
		}
		return "file:" + escapeOpaque(t.Dir)
	}
	switch {
	case t.Password != "":
		u.User = url.UserPassword(t.Username, t.Password)
	case t.Username != "":
		u.User = url.User(t.Username)
	}
	u.Host = strings.Join(t.Addrs, ",")
	q := url.Values{}
	switch t.Scheme {
	case "redis", "rediss", "redlock", "redlocks":
		if t.DB != 0 {
			u.Path = "/" + strconv.Itoa(t.DB)
		}
		for k, v := range t.Options {
			q[k] = v
		}
		t.renderAcks(q)
	case "redis+cluster", "rediss+cluster":
		for k, v := range t.Options {
			q[k] = v
		}
		if t.UnsafeEviction {
			q.Set("unsafe_eviction", "true")
		}
	case "redis+sentinel", "rediss+sentinel":
		u.Path = "/" + t.Master
		if t.DB != 0 {
			u.Path += "/" + strconv.Itoa(t.DB)
		}
		if t.SentinelUsername != "" {
			q.Set("sentinel_username", t.SentinelUsername)
		}
		if t.SentinelPassword != "" {
			q.Set("sentinel_password", t.SentinelPassword)
		}
		t.renderAcks(q)
	case "etcd", "etcds":
		if t.Prefix != "" {
			u.Path = "/" + t.Prefix
		}
	case "zk":
		u.Path = t.Chroot
		if t.SessionTimeout != 0 {
			q.Set("session_timeout", t.SessionTimeout.String())
		}
	case "postgres", "postgresql":
		c, err := url.Parse(t.Conn)
		if err != nil { // parsePostgres made it: cannot happen
			return t.Conn
		}
		cq := c.Query()
		if t.Table != "" {
			cq.Set("table", t.Table)
		}
		if t.NoListen {
			cq.Set("listen", "off")
		}
		c.RawQuery = cq.Encode()
		return c.String()
	}
	t.renderTLSParams(q)
	u.RawQuery = q.Encode()
	return u.String()
}

// renderAcks puts ?acks=, ?ack_timeout= and ?unsafe_eviction= back in q.
func (t *target) renderAcks(q url.Values) {
	if t.UnsafeEviction {
		q.Set("unsafe_eviction", "true")
	}
	if t.Acks != 0 || t.AckTimeout != 0 {
		q.Set("acks", strconv.Itoa(t.Acks))
	}
	if t.AckTimeout != 0 {
		q.Set("ack_timeout", t.AckTimeout.String())
	}
}

// escapeOpaque escapes a relative path for a file:relative URL.
func escapeOpaque(p string) string {
	s := (&url.URL{Path: p}).EscapedPath()
	// A first segment with ":" would read as a scheme; url.URL escapes
	// that only for paths it renders itself.
	return strings.ReplaceAll(s, ":", "%3A")
}

// urlHelp is --url's help.
const urlHelp = "lock service URL (default: $DLOCK_URL, else a file:// directory in your state directory; see 'dlock --help')"

// maxURLFile bounds what --url-file reads: a URL is one short line.
const maxURLFile = 64 << 10

// urlSource is a command's --url and --url-file: both write the URL to
// the same string, and check refuses both given.
type urlSource struct {
	url             *string
	urlSet, fileSet bool
}

// defineURL adds --url (help as given) and --url-file to o, both setting
// *p; call check after parsing.
func defineURL(o *optionSet, p *string, help string) *urlSource {
	s := &urlSource{url: p}
	o.Var(urlValue{s}, "", "url", "URL", help)
	o.Var(urlFileValue{s}, "", "url-file", "PATH", "read the URL from this file (surrounding white space trimmed), to keep a password out of argv and the environment")
	return s
}

// check refuses --url together with --url-file.
func (s *urlSource) check() error {
	if s.urlSet && s.fileSet {
		return errors.New("give either --url or --url-file, not both")
	}
	return nil
}

type urlValue struct{ s *urlSource }

func (v urlValue) Set(raw string) error {
	*v.s.url, v.s.urlSet = raw, true
	return nil
}

func (v urlValue) String() string { return "" } // may hold a password

type urlFileValue struct{ s *urlSource }

func (v urlFileValue) Set(path string) error {
	raw, err := readURLFile(path)
	if err != nil {
		return err
	}
	if !v.s.urlSet {
		*v.s.url = raw
	}
	v.s.fileSet = true
	return nil
}

func (v urlFileValue) String() string { return "" }

// readURLFile reads a URL from path: one line, white space around it
// trimmed. Its errors never quote the file's contents.
func readURLFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", errors.Unwrap(err) // the path is in the message already
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return "", errors.New("is a directory")
	}
	b, err := io.ReadAll(io.LimitReader(f, maxURLFile+1))
	if err != nil {
		return "", errors.Unwrap(err)
	}
	raw := strings.TrimSpace(string(b))
	switch {
	case len(b) > maxURLFile:
		return "", fmt.Errorf("longer than %d bytes: want one URL", maxURLFile)
	case raw == "":
		return "", errors.New("holds no URL")
	case strings.ContainsAny(raw, "\r\n"):
		return "", errors.New("holds more than one line: want one URL")
	}
	return raw, nil
}

// hasSecret reports whether the URL raw holds a secret: a password (or
// what may be one, text before an "@"), or an option's value that is not
// known to be plain.
func hasSecret(raw string) bool {
	return len(secretsOf(raw)) > 0
}
