package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/redislock"
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
	// LockProtocol is the protocol redislock speaks (redis-family schemes
	// but redlock: ?lock_protocol=auto|scripts|tair), ProtocolAuto by
	// default.
	LockProtocol redislock.Protocol

	// where is the URL with every secret redacted, for messages.
	where string
	// secrets are the strings to scrub from anything printed.
	secrets []string
}

// errBadURL marks URL errors (exit status 2).
var errBadURL = errors.New("bad URL")

// schemes lists the supported URL schemes, for error messages.
var schemes = []string{"file", "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel", "redlock", "redlocks", "etcd", "etcds", "zk", "postgres", "postgresql"}

// urlError is a bad URL: it wraps errBadURL and its text is already free of
// the URL's secrets.
type urlError struct{ msg string }

func (e *urlError) Error() string { return e.msg }
func (e *urlError) Unwrap() error { return errBadURL }

func badURL(raw, format string, args ...any) error {
	msg := fmt.Sprintf("%v %q: %s", errBadURL, redact(raw), fmt.Sprintf(format, args...))
	return &urlError{scrub(msg, secretsOf(raw))}
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
		if t.LockProtocol != redislock.ProtocolAuto {
			q.Set("lock_protocol", t.LockProtocol.String())
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

// renderAcks puts ?acks=, ?ack_timeout=, ?unsafe_eviction= and
// ?lock_protocol= back in q.
func (t *target) renderAcks(q url.Values) {
	if t.UnsafeEviction {
		q.Set("unsafe_eviction", "true")
	}
	if t.LockProtocol != redislock.ProtocolAuto {
		q.Set("lock_protocol", t.LockProtocol.String())
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
