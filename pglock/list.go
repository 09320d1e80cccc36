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

// List implements dlock.Lister: the keys starting with prefix whose lease
// has not expired by the database's clock, sorted by key, each with its
// holder (owner, token, metadata, time left). Waiters is -1: waiters poll
// or listen, they are not queued in the table.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	if err := l.e.Check(ctx); err != nil {
		return nil, err
	}
	if !utf8.ValidString(prefix) || strings.IndexByte(prefix, 0) >= 0 {
		// PostgreSQL's text cannot hold it (keys never do: see
		// dlock.ValidateKey).
		return nil, fmt.Errorf("%w: postgres list: prefix %q is not valid UTF-8 without NUL", dlock.ErrInvalidKey, prefix)
	}
	b := l.b
	if err := b.ready(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	rows, err := b.pool.Query(rctx, `SELECT key, owner, token, metadata::text, extract(epoch FROM expires_at - clock_timestamp())::float8
FROM `+b.n.table+` WHERE left(key, length($1)) = $1 AND expires_at > clock_timestamp() ORDER BY key COLLATE "C"`, b.mode, prefix)
	if err != nil {
		return nil, fmt.Errorf("dlock: postgres list: %w", explain(err))
	}
	defer rows.Close()
	out := []dlock.Info{}
	for rows.Next() {
		var (
			key, owner string
			token      int64
			md         string
			left       float64
		)
		if err := rows.Scan(&key, &owner, &token, &md, &left); err != nil {
			return nil, fmt.Errorf("dlock: postgres list: %w", err)
		}
		h := dlock.Holder{Owner: owner, Token: uint64(token), Mode: dlock.Exclusive, TTL: time.Duration(left * float64(time.Second))}
		_ = json.Unmarshal([]byte(md), &h.Metadata)
		out = append(out, dlock.Info{Key: key, Mode: dlock.Exclusive, Holders: []dlock.Holder{h}, Waiters: -1})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dlock: postgres list: %w", err)
	}
	return out, nil
}
