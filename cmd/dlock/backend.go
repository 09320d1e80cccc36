package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// lockInfo is one held lock as shown by `dlock ls`.
type lockInfo struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"-"`
	TTLms    int64             `json:"ttl_ms"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// backend is an opened lock service.
type backend struct {
	locker dlock.Locker
	list   func(ctx context.Context, prefix string) ([]lockInfo, error)
	close  func()
	// where is the URL with any password redacted, for messages.
	where string
}

// openBackend parses raw with parseURL (which checks it and redacts its
// secrets for messages) and connects. URL errors wrap errBadURL.
func openBackend(raw string) (*backend, error) {
	if raw == "" {
		raw = defaultURL()
	}
	t, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	// Open from the canonical URL parseURL checked.
	canon := t.URL()
	u, err := url.Parse(canon)
	if err != nil {
		return nil, badURL(raw, "%v", err)
	}
	var b *backend
	switch u.Scheme {
	case "file":
		b, err = openFile(canon, u)
	case "redis", "rediss":
		b, err = openRedis(canon, u)
	case "redis+sentinel":
		b, err = openSentinel(canon, u)
	case "redlock":
		b, err = openRedlock(canon, u)
	case "etcd", "etcds":
		b, err = openEtcd(canon, u)
	default:
		return nil, badURL(raw, "unknown scheme %q", u.Scheme)
	}
	if err != nil {
		var ue *urlError
		if errors.As(err, &ue) {
			return nil, err
		}
		return nil, errors.New(scrub(err.Error(), t.secrets))
	}
	b.where = t.where
	return b, nil
}

func openFile(raw string, u *url.URL) (*backend, error) {
	dir := u.Path
	if u.Opaque != "" { // file:relative/dir
		dir = u.Opaque
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, badURL(raw, "file URLs name a local directory: use file:///absolute/path (host %q given)", u.Host)
	}
	if dir == "" {
		return nil, badURL(raw, "missing directory path")
	}
	l, err := filelock.New(dir)
	if err != nil {
		return nil, err
	}
	list := listVia(l.List, func(in filelock.Info) lockInfo {
		return lockInfo{Key: in.Key, Owner: in.Owner, Token: in.Token, TTL: in.TTL, Metadata: in.Metadata}
	})
	return &backend{locker: l, list: list, close: func() {}, where: u.Redacted()}, nil
}

func checkHostPort(raw, hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return badURL(raw, "address %q is not host:port", hp)
	}
	if host == "" {
		return badURL(raw, "address %q has no host", hp)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return badURL(raw, "port %q is not a number in 1-65535", port)
	}
	return nil
}

func redisBackend(raw string, u *url.URL, c redis.UniversalClient) *backend {
	l := redislock.New(c)
	list := listVia(l.List, func(in redislock.Info) lockInfo {
		return lockInfo{Key: in.Key, Owner: in.Owner, Token: in.Token, TTL: in.TTL, Metadata: in.Metadata}
	})
	return &backend{locker: l, list: list, close: func() { c.Close() }, where: u.Redacted()}
}

func openRedis(raw string, u *url.URL) (*backend, error) {
	hp := u.Host
	if u.Port() == "" {
		hp = net.JoinHostPort(u.Hostname(), "6379")
	}
	if err := checkHostPort(raw, hp); err != nil {
		return nil, err
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, badURL(raw, "%s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	return redisBackend(raw, u, redis.NewClient(opt)), nil
}

// openSentinel parses redis+sentinel://[user:pass@]h1:p1,h2:p2/master[/db].
func openSentinel(raw string, u *url.URL) (*backend, error) {
	if u.Host == "" {
		return nil, badURL(raw, "no sentinel addresses")
	}
	addrs := strings.Split(u.Host, ",")
	for _, a := range addrs {
		if err := checkHostPort(raw, a); err != nil {
			return nil, err
		}
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	if parts[0] == "" {
		return nil, badURL(raw, "missing master name: redis+sentinel://h1:p1,h2:p2/MASTER")
	}
	opt := &redis.FailoverOptions{MasterName: parts[0], SentinelAddrs: addrs}
	if len(parts) > 1 {
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return nil, badURL(raw, "database %q is not a non-negative number", parts[1])
		}
		opt.DB = db
	}
	if len(parts) > 2 {
		return nil, badURL(raw, "path has too many parts: want /MASTER[/DB]")
	}
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	opt.SentinelPassword = u.Query().Get("sentinel_password")
	return redisBackend(raw, u, redis.NewFailoverClient(opt)), nil
}

func sortInfos(in []lockInfo) {
	sort.Slice(in, func(i, j int) bool { return in[i].Key < in[j].Key })
}

// listVia adapts a backend's List to lockInfo.
func listVia[T any](list func(context.Context, string) ([]T, error), conv func(T) lockInfo) func(context.Context, string) ([]lockInfo, error) {
	return func(ctx context.Context, prefix string) ([]lockInfo, error) {
		infos, err := list(ctx, prefix)
		if err != nil {
			return nil, err
		}
		out := make([]lockInfo, 0, len(infos))
		for _, in := range infos {
			out = append(out, conv(in))
		}
		return out, nil
	}
}

// openRedlock parses redlock://[user:pass@]h1:p1,h2:p2,h3:p3[/db]: one
// independent master per address.
func openRedlock(raw string, u *url.URL) (*backend, error) {
	if u.Host == "" {
		return nil, badURL(raw, "no node addresses: redlock://h1:p1,h2:p2,h3:p3")
	}
	addrs := strings.Split(u.Host, ",")
	seen := map[string]bool{}
	for _, a := range addrs {
		if err := checkHostPort(raw, a); err != nil {
			return nil, err
		}
		if seen[a] {
			return nil, badURL(raw, "address %q is listed twice", a)
		}
		seen[a] = true
	}
	db := 0
	if p := strings.Trim(u.Path, "/"); p != "" {
		var err error
		if db, err = strconv.Atoi(p); err != nil || db < 0 {
			return nil, badURL(raw, "database %q is not a non-negative number", p)
		}
	}
	var user, pass string
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	clients := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, Username: user, Password: pass, DB: db})
	}
	l := redlock.New(clients)
	list := listVia(l.List, func(in redlock.Info) lockInfo {
		return lockInfo{Key: in.Key, Owner: in.Owner, Token: in.Token, TTL: in.TTL, Metadata: in.Metadata}
	})
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	return &backend{locker: l, list: list, close: closeAll, where: u.Redacted()}, nil
}

// openEtcd parses etcd[s]://[user:pass@]h1:p1[,h2:p2][/prefix][?ca=FILE]
// and checks the cluster answers (so an unreachable cluster is an error,
// not an endless wait).
func openEtcd(raw string, u *url.URL) (*backend, error) {
	if u.Host == "" {
		return nil, badURL(raw, "no endpoints: etcd://h1:p1[,h2:p2]")
	}
	scheme := "http"
	var tlsCfg *tls.Config
	if u.Scheme == "etcds" {
		scheme, tlsCfg = "https", &tls.Config{MinVersion: tls.VersionTLS12}
		if ca := u.Query().Get("ca"); ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, badURL(raw, "ca file: %v", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, badURL(raw, "ca file %q holds no PEM certificate", ca)
			}
			tlsCfg.RootCAs = pool
		}
	} else if u.Query().Has("ca") {
		return nil, badURL(raw, "?ca= needs etcds://")
	}
	var eps []string
	for _, a := range strings.Split(u.Host, ",") {
		if err := checkHostPort(raw, a); err != nil {
			return nil, err
		}
		eps = append(eps, scheme+"://"+a)
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, TLS: tlsCfg}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", u.Redacted(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "dlock-probe", clientv3.WithCountOnly()); err != nil {
		c.Close()
		return nil, fmt.Errorf("etcd %s: not reachable: %w", u.Redacted(), err)
	}
	prefix := strings.TrimPrefix(u.Path, "/")
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	l := etcdlock.New(c, etcdlock.WithPrefix(prefix))
	list := listVia(l.List, func(in etcdlock.Info) lockInfo {
		return lockInfo{Key: in.Key, Owner: in.Owner, Token: in.Token, TTL: in.TTL, Metadata: in.Metadata}
	})
	return &backend{locker: l, list: list, close: func() { c.Close() }, where: u.Redacted()}, nil
}
