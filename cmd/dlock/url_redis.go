package main

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/redislock"
)

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
	if err := t.takeLockProtocol(raw, q); err != nil {
		return err
	}
	// go-redis checks its own options, without dlock's TLS files, acks,
	// eviction and lock protocol.
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
	q, err := query(raw, u, append(known, "sentinel_username", "sentinel_password", "acks", "ack_timeout", "unsafe_eviction", "lock_protocol")...)
	if err != nil {
		return err
	}
	if err := t.takeUnsafeEviction(raw, q); err != nil {
		return err
	}
	if err := t.takeLockProtocol(raw, q); err != nil {
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

// takeLockProtocol takes ?lock_protocol=auto|scripts|tair out of q: the
// protocol redislock speaks (redislock.WithProtocol). go-redis's own
// ?protocol= is the RESP version.
func (t *target) takeLockProtocol(raw string, q url.Values) error {
	if !q.Has("lock_protocol") {
		return nil
	}
	if len(q["lock_protocol"]) > 1 {
		return badURL(raw, "option ?lock_protocol= given %d times", len(q["lock_protocol"]))
	}
	p, err := redislock.ParseProtocol(q.Get("lock_protocol"))
	if err != nil {
		return badURL(raw, "?lock_protocol=%q is not auto, scripts or tair", q.Get("lock_protocol"))
	}
	t.LockProtocol = p
	q.Del("lock_protocol")
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
