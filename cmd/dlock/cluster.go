package main

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// defaultRedisPort is the port of a Redis address given without one.
const defaultRedisPort = "6379"

// parseCluster checks redis[s]+cluster://[user:pass@]h1:p1[,h2:p2][?go-redis
// cluster options], and for rediss+cluster ?ca=, ?cert= and ?key=. The
// addresses are nodes to learn the cluster's layout from (any of them;
// port 6379 if none). A Cluster has database 0 only: no /db path.
func (t *target) parseCluster(raw string, u *url.URL) error {
	if u.Opaque != "" || u.Host == "" {
		return badURL(raw, "no nodes: %s://[user:pass@]h1:p1[,h2:p2]", u.Scheme)
	}
	hosts := strings.Split(u.Host, ",")
	for i, h := range hosts {
		if h != "" && (!strings.Contains(h, ":") || strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]")) {
			hosts[i] = h + ":" + defaultRedisPort
		}
	}
	addrs, err := addrList(raw, strings.Join(hosts, ","), "node")
	if err != nil {
		return err
	}
	if u.Path != "" && u.Path != "/" {
		return badURL(raw, "a Redis Cluster has database 0 only: no /DB path (%q given)", u.Path)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return badURL(raw, "query: %v", err)
	}
	for _, p := range []string{"addr", "db"} {
		if q.Has(p) {
			return badURL(raw, "%s URLs take no ?%s= option: list the nodes as h1:p1,h2:p2", u.Scheme, p)
		}
	}
	if err := t.takeTLSParams(raw, u, q); err != nil {
		return err
	}
	if err := t.takeUnsafeEviction(raw, q); err != nil {
		return err
	}
	if err := t.takeLockProtocol(raw, q); err != nil {
		return err
	}
	// go-redis checks its own cluster options.
	if _, err := redis.ParseClusterURL((&url.URL{Scheme: "redis", Host: addrs[0], RawQuery: q.Encode()}).String()); err != nil {
		return badURL(raw, "%s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	t.Addrs = addrs
	if len(q) > 0 {
		t.Options = q
	}
	return nil
}

// clusterOptions are the go-redis Cluster client's options: the URL's
// options, the CLI's timeouts where the URL sets none, and TLS.
func (t *target) clusterOptions(o openOptions) (*redis.ClusterOptions, error) {
	opt, err := redis.ParseClusterURL((&url.URL{Scheme: "redis", Host: t.Addrs[0], RawQuery: t.Options.Encode()}).String())
	if err != nil { // parseURL accepted it: cannot happen
		return nil, &urlError{scrub(fmt.Sprintf("%v %q: %v", errBadURL, t.where, err), t.secrets)}
	}
	opt.Addrs = append([]string(nil), t.Addrs...)
	opt.Username, opt.Password = t.Username, t.Password
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
	if t.TLS {
		if opt.TLSConfig, err = t.tlsConfig(); err != nil {
			return nil, err
		}
	}
	return opt, nil
}

// openCluster makes a go-redis Cluster client; redislock keeps each
// lock's keys in one slot.
func (t *target) openCluster(o openOptions) (*backend, error) {
	opt, err := t.clusterOptions(o)
	if err != nil {
		return nil, err
	}
	return t.redisBackend(redis.NewClusterClient(opt), o), nil
}
