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

// lease is one held row: the key's row in the lease table (Exclusive),
// or the holder's row in the holders table (Shared, Limited).
type lease struct {
	b          *backend
	key, owner string
	mode       driver.Mode

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

// RefreshBatch implements driver.BatchRenewer: one statement for every
// lease due, each extended from the database's clock, only while still
// its owner's and not expired. Exclusive leases are their keys' rows;
// shared and limited ones are holder rows, whose renewal first locks
// their keys' rows (in key order, so that two batches cannot deadlock)
// and bumps their gen, so that a grant deciding on a snapshot taken
// before the renewal sees that the holders changed; the holder row is
// renewed only if it is still live at a time read after that lock, so a
// writer that took the key first is never overlapped by a late renewal.
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	var keys, owners, hkeys, howners []string
	var ttls, httls []int64
	for _, r := range rs {
		l := r.Lease.(*lease)
		if l.mode == driver.Exclusive {
			keys, owners, ttls = append(keys, l.key), append(owners, l.owner), append(ttls, r.TTL.Milliseconds())
		} else {
			hkeys, howners, httls = append(hkeys, l.key), append(howners, l.owner), append(httls, r.TTL.Milliseconds())
		}
	}
	excl := `UPDATE ` + b.n.table + ` AS l
SET expires_at = clock_timestamp() + x.ttl * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS x(key, owner, ttl)
WHERE l.key = x.key AND l.owner = x.owner AND l.expires_at > clock_timestamp()
RETURNING l.key, l.owner`
	sql, args := excl, []any{b.mode, keys, owners, ttls}
	if len(hkeys) > 0 {
		sql = `WITH x AS (` + excl + `), gate AS (
	SELECT g.key FROM ` + b.n.table + ` g WHERE g.key = ANY($4::text[]) ORDER BY g.key FOR UPDATE
), k AS (
	UPDATE ` + b.n.table + ` AS g SET gen = g.gen + 1 FROM gate WHERE g.key = gate.key
	RETURNING g.key, clock_timestamp() AS at
), h AS (
	UPDATE ` + b.n.holders + ` AS r
	SET expires_at = clock_timestamp() + y.ttl * interval '1 millisecond'
	FROM unnest($4::text[], $5::text[], $6::bigint[]) AS y(key, owner, ttl), k
	WHERE r.key = y.key AND r.owner = y.owner AND k.key = y.key AND r.expires_at > k.at AND NOT r.released
	RETURNING r.key, r.owner
)
SELECT key, owner FROM x UNION ALL SELECT key, owner FROM h`
		args = append(args, hkeys, howners, httls)
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	sent := time.Now()
	rows, err := b.pool.Query(rctx, sql, args...)
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
	for i, r := range rs {
		l := r.Lease.(*lease)
		switch {
		case err != nil:
			done(i, outage(fmt.Errorf("dlock: postgres refresh: %w", explain(err))))
		case renewed[[2]string{l.key, l.owner}]:
			done(i, nil)
		default:
			done(i, l.notHeld("expired or taken over"))
		}
	}
}

var _ driver.LossNotifier = (*lease)(nil)

// breakListenDelay is how long a lock is held before it listens for the
// notices a dlock.Break sends. Most locks are held for less: they cost
// no subscription and no check, and a break of one is found by its
// release or renewal.
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, the lease subscribes to its key on the Locker's
// LISTEN connection (the one waiters use), and on each notice for the key
// (a break, or another holder's release or renewal on a shared key) reads
// its own row once: when it is no longer this owner's live lease, the
// Lock is lost at once (wrapping dlock.ErrNotHeld), not at its next
// renewal, up to TTL/3 later. It also reads once when it subscribes and
// whenever the LISTEN connection is opened again, so a break before
// either is found too. Without a LISTEN (WithoutListen, or a pooler in
// between, where NOTIFY does not cross) the next renewal finds the break.
// stop cancels the listening without waiting on the network.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	if l.b.l == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Not background work: it lasts as long as the lock (or the client).
	t := time.AfterFunc(breakListenDelay, func() { go l.listenBreaks(ctx, lose) })
	return func() {
		t.Stop()
		cancel()
	}
}

// listenBreaks is Bind's listener, until ctx ends or the lock is lost.
func (l *lease) listenBreaks(ctx context.Context, lose func(cause error)) {
	if l.b.l.gaveUp() != nil {
		return
	}
	s := l.b.l.add(l.key)
	defer s.Close()
	check := make(chan struct{}, 1)
	check <- struct{}{} // a break before the subscription
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.C():
		case <-check:
		}
		if l.b.l.gaveUp() != nil {
			return // no NOTIFY can arrive: the renewals find a break
		}
		live, err := l.live(ctx)
		if err == nil && !live {
			lose(l.notHeld("broken, or expired on the server"))
			return
		}
		// An error (an outage, the lock ending) decides nothing: the
		// renewals report an outage, and stop ends the listening.
	}
}

// live reports whether the lease's row is still this owner's live
// lease, read with one statement bounded by the request timeout.
func (l *lease) live(ctx context.Context) (bool, error) {
	sql := `SELECT EXISTS (SELECT 1 FROM ` + l.b.n.table + ` WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp())`
	if l.mode != driver.Exclusive {
		sql = `SELECT EXISTS (SELECT 1 FROM ` + l.b.n.holders + ` WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp() AND NOT released)`
	}
	rctx, cancel := l.b.rpc(ctx)
	defer cancel()
	var live bool
	err := l.b.pool.QueryRow(rctx, sql, l.b.mode, l.key, l.owner).Scan(&live)
	return live, err
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
	if l.mode != driver.Exclusive {
		ok, err := b.releaseShared(ctx, l.key, l.owner)
		if err != nil {
			return outage(fmt.Errorf("dlock: postgres release %q: %w", l.key, explain(err)))
		}
		if !ok {
			return l.notHeld("expired before the release")
		}
		l.mu.Lock()
		l.gone = true
		l.mu.Unlock()
		return nil
	}
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
		return outage(fmt.Errorf("dlock: postgres release %q: %w", l.key, explain(err)))
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
