package redisproto

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// List returns the leases whose key starts with prefix, by SCAN (on every
// master of a Cluster): an exclusive lease as one Info, a group of shared
// or limited holders as one Info with its Group, Limit and live Holders
// (read by holders.lua). For operators, not hot paths.
func (n *Node) List(ctx context.Context, prefix string) ([]Info, error) {
	tag := ""
	if prefix != "" {
		tag = HashTag(prefix)
	}
	pattern := n.Prefix + ":{" + globEscape(tag) + "*"
	var (
		mu  sync.Mutex
		out []Info
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, pattern, 512).Iterator()
		var keys []string
		for it.Next(ctx) {
			k := it.Val()
			if !strings.HasSuffix(k, "}") { // :fence, :waiters, :rel
				continue
			}
			// The pattern matches on the Redis key, not on the dlock key:
			// with a '}' in prefix, "P:{a}*" also matches the lock of "a"
			// ("P:{a}"). Only keys that start with prefix are listed.
			if !strings.HasPrefix(n.decodeLockKey(k), prefix) {
				continue
			}
			keys = append(keys, k)
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
			if strings.HasPrefix(v, "|") {
				continue // a release marker: not held
			}
			if mode, _, limit, ok := ParseGroup(v); ok {
				in, err := n.listGroup(ctx, c, k, mode, limit)
				if err != nil {
					return err
				}
				if len(in.Holders) > 0 {
					mu.Lock()
					out = append(out, in)
					mu.Unlock()
				}
				continue
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			if ttl < 0 {
				continue // the lease ended since the GET (-2: no such key)
			}
			in := ParseValue(v)
			in.Key = n.decodeLockKey(k)
			in.TTL = ttl
			mu.Lock()
			out = append(out, in)
			mu.Unlock()
		}
		return nil
	}
	var err error
	if cc, ok := n.Client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, n.Client)
	}
	return out, err
}

// listGroup reads the live holders of the group at lock key k.
func (n *Node) listGroup(ctx context.Context, c redis.Cmdable, k, mode string, limit int) (Info, error) {
	res, err := holdersScript.Run(ctx, c, []string{k, k + holdersSuffix, k + holderDataSuffix}).Slice()
	if err != nil {
		return Info{}, err
	}
	in := Info{Key: n.decodeLockKey(k), Group: mode, Limit: limit}
	if len(res) == 2 {
		if m, _, l, ok := ParseGroup(fmt.Sprint(res[0])); ok {
			in.Group, in.Limit = m, l
			in.Holders = parseHolders(res[1], m)
		}
	}
	for _, h := range in.Holders {
		in.TTL = max(in.TTL, h.TTL)
	}
	return in, nil
}

// globEscape escapes s for a SCAN pattern, byte by byte: a prefix need not
// be valid UTF-8 (it may end inside a character), and ranging over runes
// would turn each invalid byte into U+FFFD.
func globEscape(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			sb.WriteByte('\\')
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}
