// Listing: List (dlock.Lister) reads the live rows of the lease table.

package pglock

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
)

// List implements dlock.Lister: the keys starting with prefix that have a
// live lease by the database's clock, sorted by key, each with its mode,
// its limit (Limited keys) and its holders, by token (owner, token,
// metadata, time left, mode, time held by the database's clock): the exclusive holder, or every shared or
// limited one. Waiters is -1: waiters poll or listen, they are not queued
// in the table.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	if !utf8.ValidString(prefix) || strings.IndexByte(prefix, 0) >= 0 {
		// PostgreSQL's text cannot hold it (keys never do: see
		// dlock.ValidateKey).
		return nil, fmt.Errorf("%w: postgres list: prefix %q is not valid UTF-8 without NUL", dlock.ErrInvalidKey, prefix)
	}
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	rows, err := b.pool.Query(rctx, `SELECT * FROM (
SELECT key, 0::int AS mode, 0::int AS lim, owner, token, metadata::text, extract(epoch FROM expires_at - clock_timestamp())::float8, extract(epoch FROM clock_timestamp() - acquired_at)::float8
FROM `+b.n.table+` WHERE left(key, length($1)) = $1 AND expires_at > clock_timestamp()
UNION ALL
SELECT h.key, h.mode::int, coalesce(k.hlimit, 0)::int, h.owner, h.token, h.metadata::text, extract(epoch FROM h.expires_at - clock_timestamp())::float8, extract(epoch FROM clock_timestamp() - h.acquired_at)::float8
FROM `+b.n.holders+` h LEFT JOIN `+b.n.table+` k ON k.key = h.key
WHERE left(h.key, length($1)) = $1 AND h.expires_at > clock_timestamp() AND NOT h.released
) u ORDER BY key COLLATE "C", token`, b.stmt.get(), prefix)
	if err != nil {
		return nil, fmt.Errorf("dlock: postgres list: %w", explain(err))
	}
	defer rows.Close()
	out := []dlock.Info{}
	for rows.Next() {
		var (
			key, owner string
			mode, lim  int
			token      int64
			md         string
			left, held float64
		)
		if err := rows.Scan(&key, &mode, &lim, &owner, &token, &md, &left, &held); err != nil {
			return nil, fmt.Errorf("dlock: postgres list: %w", err)
		}
		h := dlock.Holder{Owner: owner, Token: uint64(token), Mode: dlock.Mode(mode), TTL: time.Duration(left * float64(time.Second)), HeldFor: time.Duration(max(held, 0) * float64(time.Second))}
		_ = json.Unmarshal([]byte(md), &h.Metadata)
		if n := len(out); n > 0 && out[n-1].Key == key {
			out[n-1].Holders = append(out[n-1].Holders, h)
			continue
		}
		info := dlock.Info{Key: key, Mode: h.Mode, Holders: []dlock.Holder{h}, Waiters: -1}
		if h.Mode == dlock.Limited {
			info.Limit = lim
		}
		out = append(out, info)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dlock: postgres list: %w", err)
	}
	return out, nil
}
