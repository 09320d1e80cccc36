package redislock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Defaults.
const (
	// DefaultPrefix starts every key dlock writes: "dlock:{<key>}".
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// FenceRetention is how long a key's fencing counter outlives its last
	// acquisition (see the package documentation).
	FenceRetention = time.Hour
)

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix string
}

// WithPrefix sets the key prefix (default DefaultPrefix). Lockers must use
// the same prefix to exclude each other.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// Locker is a lock service on one Redis deployment (standalone, Sentinel
// or Cluster through a go-redis UniversalClient). It never closes the
// client. All locks taken through one Locker are renewed together by one
// watchdog, one pipelined round trip per tick.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

// New returns a Locker on client. A nil client gives a Locker whose every
// call fails with dlock.ErrNilClient.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.prefix == "" {
		o.prefix = DefaultPrefix
	}
	if isNil(client) {
		client = nil
	}
	b := &backend{client: client, prefix: o.prefix}
	b.hub = newHub(client)
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

// isNil catches typed nil pointers inside the interface.
func isNil(c redis.UniversalClient) bool {
	switch v := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return v == nil
	case *redis.ClusterClient:
		return v == nil
	case *redis.Ring:
		return v == nil
	}
	return false
}

type backend struct {
	client redis.UniversalClient
	prefix string
	hub    *hub
}

// LockKey is the Redis key holding key's lease.
func (l *Locker) LockKey(key string) string { return l.b.lockKey(key) }

func (b *backend) lockKey(key string) string  { return b.prefix + ":{" + key + "}" }
func (b *backend) fenceKey(key string) string { return b.lockKey(key) + ":fence" }
func (b *backend) channel(key string) string  { return b.lockKey(key) + ":released" }

func (b *backend) check() error {
	if b.client == nil {
		return fmt.Errorf("%w: redislock.New was given a nil redis client", dlock.ErrNilClient)
	}
	return nil
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Try implements dlock.Backend.
func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	meta, err := json.Marshal(req.Config.Metadata)
	if err != nil {
		return dlock.Grant{}, err
	}
	res, err := acquireScript.Run(ctx, b.client, []string{b.lockKey(req.Key), b.fenceKey(req.Key)},
		req.Owner, ms(req.Config.TTL), string(meta), ms(req.Config.TTL+FenceRetention)).Slice()
	if err != nil {
		return dlock.Grant{}, fmt.Errorf("dlock: redis acquire %q: %w", req.Key, err)
	}
	if len(res) >= 2 && res[0] == int64(1) {
		tok, err := strconv.ParseUint(fmt.Sprint(res[1]), 10, 64)
		if err != nil {
			return dlock.Grant{}, fmt.Errorf("dlock: redis acquire %q: bad token %v", req.Key, res[1])
		}
		return dlock.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner}, Token: tok}, nil
	}
	na := &dlock.NotAcquiredError{Key: req.Key}
	if len(res) >= 3 {
		h := parseValue(fmt.Sprint(res[1]))
		na.Holder, na.Metadata = h.Owner, h.Metadata
		if pttl, ok := res[2].(int64); ok && pttl > 0 {
			na.TTL = time.Duration(pttl) * time.Millisecond
		}
	}
	return dlock.Grant{}, na
}

// Abort implements dlock.Aborter: delete the lease if the lost reply had
// granted it.
func (b *backend) Abort(ctx context.Context, req *dlock.Request) error {
	if err := b.check(); err != nil {
		return err
	}
	return (&lease{b: b, key: req.Key, owner: req.Owner}).Release(ctx)
}

// Watch implements dlock.Watcher with Redis pub/sub.
func (b *backend) Watch(ctx context.Context, key string) (dlock.Subscription, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	return b.hub.watch(ctx, b.channel(key))
}

// RefreshBatch implements dlock.BatchRenewer: one pipeline of
// compare-and-pexpire scripts (go-redis splits it per node on Cluster).
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal) []error {
	errs := make([]error, len(rs))
	if err := b.check(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	cmds := make([]*redis.Cmd, len(rs))
	_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range rs {
			l := r.Lease.(*lease)
			cmds[i] = refreshScript.EvalSha(ctx, p, []string{b.lockKey(l.key)}, l.owner+"|", ms(r.TTL))
		}
		return nil
	})
	for i, c := range cmds {
		l := rs[i].Lease.(*lease)
		n, err := c.Int64()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// The server lost its script cache (restart, SCRIPT FLUSH):
			// Run loads it again.
			n, err = refreshScript.Run(ctx, b.client, []string{b.lockKey(l.key)}, l.owner+"|", ms(rs[i].TTL)).Int64()
		}
		errs[i] = l.result("refresh", n, err)
	}
	return errs
}

type lease struct {
	b          *backend
	key, owner string
}

func (l *lease) result(op string, n int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("dlock: redis %s %q: %w", op, l.key, err)
	case n == 0:
		return fmt.Errorf("%w: redis key %s no longer holds owner %s", dlock.ErrNotHeld, l.b.lockKey(l.key), l.owner)
	}
	return nil
}

// Refresh implements dlock.Lease (compare-and-pexpire).
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	n, err := refreshScript.Run(ctx, l.b.client, []string{l.b.lockKey(l.key)}, l.owner+"|", ms(ttl)).Int64()
	return l.result("refresh", n, err)
}

// Release implements dlock.Lease (compare-and-delete, then publish).
func (l *lease) Release(ctx context.Context) error {
	n, err := releaseScript.Run(ctx, l.b.client, []string{l.b.lockKey(l.key)}, l.owner+"|", l.b.channel(l.key)).Int64()
	return l.result("release", n, err)
}

// Info describes a held lock, as stored in Redis.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// parseValue splits a lock value "<owner>|<token>|<metadata json>".
func parseValue(v string) Info {
	var in Info
	parts := strings.SplitN(v, "|", 3)
	in.Owner = parts[0]
	if len(parts) > 1 {
		in.Token, _ = strconv.ParseUint(parts[1], 10, 64)
	}
	if len(parts) > 2 {
		_ = json.Unmarshal([]byte(parts[2]), &in.Metadata)
	}
	return in
}

// List returns the locks currently held whose key starts with prefix, by
// scanning the keyspace (SCAN, on every master of a Cluster). It is meant
// for operators (dlock ls), not for hot paths.
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	b := l.b
	if err := b.check(); err != nil {
		return nil, err
	}
	pattern := b.prefix + ":{" + globEscape(prefix) + "*"
	var out []Info
	scan := func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, pattern, 512).Iterator()
		var keys []string
		for it.Next(ctx) {
			k := it.Val()
			if strings.HasSuffix(k, "}") { // skip :fence and other companions
				keys = append(keys, k)
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		for _, k := range keys {
			v, err := c.Get(ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return err
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			in := parseValue(v)
			in.Key = strings.TrimSuffix(strings.TrimPrefix(k, b.prefix+":{"), "}")
			in.TTL = ttl
			out = append(out, in)
		}
		return nil
	}
	var err error
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		var mu = make(chan struct{}, 1)
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return scan(ctx, c)
		})
	} else {
		err = scan(ctx, b.client)
	}
	if err != nil {
		return nil, fmt.Errorf("dlock: redis list: %w", err)
	}
	return out, nil
}

func globEscape(s string) string {
	var sb strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			sb.WriteByte('\\')
		}
		sb.WriteRune(r)
	}
	return sb.String()
}
