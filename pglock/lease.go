// The held lock: a row owned by this attempt, renewed (Refresh,
// RefreshBatch) and released with owner-checked statements.

package pglock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// lease is one held row.
type lease struct {
	b          *backend
	key, owner string

	mu   sync.Mutex
	gone bool // a release of ours marked the row released
}

func (l *lease) notHeld(why string) error {
	return fmt.Errorf("%w: postgres lock %q: %s", dlock.ErrNotHeld, l.key, why)
}

// Refresh implements driver.Lease.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	var out error
	l.b.RefreshBatch(ctx, []driver.Renewal{{Lease: l, TTL: ttl}}, func(_ int, err error) { out = err })
	return out
}

// RefreshBatch implements driver.BatchRenewer: one UPDATE for every lease
// due, each extended from the database's clock, only while still its
// owner's and not expired.
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	keys := make([]string, len(rs))
	owners := make([]string, len(rs))
	ttls := make([]int64, len(rs))
	for i, r := range rs {
		l := r.Lease.(*lease)
		keys[i], owners[i], ttls[i] = l.key, l.owner, r.TTL.Milliseconds()
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	sent := time.Now()
	rows, err := b.pool.Query(rctx, `UPDATE `+b.n.table+` AS l
SET expires_at = clock_timestamp() + x.ttl * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(key, owner, ttl)
WHERE l.key = x.key AND l.owner = x.owner AND l.expires_at > clock_timestamp()
RETURNING l.key, l.owner`, b.mode, keys, owners, ttls)
	renewed := map[[2]string]bool{}
	if err == nil {
		for rows.Next() {
			var k, o string
			if err = rows.Scan(&k, &o); err != nil {
				break
			}
			renewed[[2]string{k, o}] = true
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err == nil {
			b.answered(sent)
		}
	}
	for i := range rs {
		switch {
		case err != nil:
			done(i, fmt.Errorf("dlock: postgres refresh: %w", explain(err)))
		case renewed[[2]string{keys[i], owners[i]}]:
			done(i, nil)
		default:
			done(i, rs[i].Lease.(*lease).notHeld("expired or taken over"))
		}
	}
}

// Release implements driver.Lease: mark the row released (its expiry set
// to -infinity, keeping its token for the key's next grant) only if it is
// still this owner's live lease, and notify waiters, in one statement. A
// retried release whose first one took effect finds its own row marked
// released and succeeds.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.gone {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	b := l.b
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	var released, notified int64
	var before bool
	sent := time.Now()
	err := b.pool.QueryRow(rctx, `WITH r AS (
	UPDATE `+b.n.table+` SET expires_at = '-infinity'
	WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()
	RETURNING key
), n AS (SELECT pg_notify($3, key) FROM r)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM n),
	EXISTS (SELECT 1 FROM `+b.n.table+` WHERE key = $1 AND owner = $2 AND expires_at = '-infinity')`,
		b.mode, l.key, l.owner, b.n.channelName()).Scan(&released, &notified, &before)
	if err != nil {
		return fmt.Errorf("dlock: postgres release %q: %w", l.key, explain(err))
	}
	b.answered(sent)
	l.mu.Lock()
	defer l.mu.Unlock()
	if released > 0 || before {
		l.gone = true
		return nil
	}
	return l.notHeld("expired or taken over before the release")
}
