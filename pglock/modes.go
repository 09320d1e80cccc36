// Shared and limited holders: one row each in the holders table, granted
// under the lock of the key's row in the lease table, aborted and
// released by owner-checked statements.

package pglock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// tryShared is Try for a Shared or Limited request, in one statement. It
// reads, from its snapshot, the key's row (k), its live exclusive lease
// (live), its live shared or limited holders (hs), this owner's own live
// holder row (mine: a retry whose first reply was lost gets it back) and
// whether a writer waits. If the request may join (no exclusive holder;
// for Shared, no waiting writer; holders of its mode and, for Limited, its
// limit and fewer than it), it locks the key's row by an upsert whose
// condition is checked on the row's latest version: no live exclusive
// lease, and gen unchanged since the snapshot (every shared or limited
// grant and every renewal of one bumps it, so the snapshot's holders are
// still the key's; a Shared request joining a key whose last grant was
// Shared needs no such check, since no grant of another mode can have
// come between). The upsert draws the key's next token from the sequence
// under that lock, bumps gen and records the mode and limit; the holder's
// row is then inserted with that token and its own expiry. Exclusive
// grants check the same snapshot of holders and the same gen, so the
// modes cannot race.
func (b *backend) tryShared(ctx context.Context, req *driver.Request, md string) (driver.Grant, error) {
	t, hs := b.n.table, b.n.holders
	sql := `WITH k AS (
	SELECT h.gen, h.hmode, h.hlimit FROM ` + t + ` h WHERE h.key = $1
), live AS (
	SELECT h.token, h.owner, h.metadata, h.expires_at FROM ` + t + ` h
	WHERE h.key = $1 AND h.expires_at > clock_timestamp()
), hs AS (
	SELECT r.token, r.owner, r.metadata, r.expires_at, r.mode FROM ` + hs + ` r
	WHERE r.key = $1 AND r.expires_at > clock_timestamp() AND NOT r.released
), mine AS (
	SELECT hs.token, hs.expires_at FROM hs WHERE hs.owner = $2
), undone AS (
	SELECT 1 FROM ` + hs + ` u WHERE u.key = $1 AND u.owner = $2 AND u.released
), writer AS (
	SELECT EXISTS (SELECT 1 FROM ` + b.n.writers + ` w WHERE w.key = $1 AND w.expires_at > clock_timestamp()) AS waiting
), ok AS (
	SELECT NOT EXISTS (SELECT 1 FROM mine) AND NOT EXISTS (SELECT 1 FROM live) AND NOT EXISTS (SELECT 1 FROM undone)
		AND ($5::int <> 1 OR NOT (SELECT waiting FROM writer))
		AND (NOT EXISTS (SELECT 1 FROM hs) OR coalesce((
			SELECT k.hmode = $5::int AND ($5::int = 1 OR (k.hlimit = $6::int AND (SELECT count(*) FROM hs) < $6::int))
			FROM k), false)) AS go
), taken AS (
	INSERT INTO ` + t + ` AS l (key, owner, token, expires_at, metadata, acquired_at, gen, hmode, hlimit)
	SELECT $1, '', CASE WHEN EXISTS (SELECT 1 FROM k) THEN 0 ELSE nextval('` + b.n.sequence + `') END,
		'-infinity', '{}'::jsonb, clock_timestamp(), 1, $5::int, $6::int
	FROM ok WHERE ok.go
	ON CONFLICT (key) DO UPDATE
		SET token = nextval('` + b.n.sequence + `'), gen = l.gen + 1, hmode = EXCLUDED.hmode, hlimit = EXCLUDED.hlimit
		WHERE l.expires_at <= clock_timestamp()
		  AND (l.gen = coalesce((SELECT k.gen FROM k), 0) OR ($5::int = 1 AND l.hmode = 1))
	RETURNING l.token
), ins AS (
	INSERT INTO ` + hs + ` AS r (key, owner, mode, token, expires_at, metadata, acquired_at)
	SELECT $1, $2, $5::int, taken.token, clock_timestamp() + $3 * interval '1 millisecond', $4::text::jsonb, clock_timestamp()
	FROM taken
	ON CONFLICT (key, owner) DO UPDATE
		SET mode = EXCLUDED.mode, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at, released = false,
		    metadata = EXCLUDED.metadata, acquired_at = EXCLUDED.acquired_at
		WHERE NOT r.released
	RETURNING r.token
), gc AS (
	DELETE FROM ` + hs + ` g
	WHERE g.key = $1 AND g.expires_at < clock_timestamp() - interval '5 minutes' AND EXISTS (SELECT 1 FROM taken)
)
SELECT 'won'::text, ins.token, ''::text, '{}'::text, 0::float8, 0::int, 0::int, false FROM ins
UNION ALL
SELECT 'mine', mine.token, '', '{}', extract(epoch FROM mine.expires_at - clock_timestamp())::float8, 0, 0, false FROM mine
UNION ALL
SELECT 'held', live.token, live.owner, live.metadata::text, extract(epoch FROM live.expires_at - clock_timestamp())::float8, 0, 0, false
FROM live WHERE NOT EXISTS (SELECT 1 FROM ins)
UNION ALL
SELECT 'held', hs.token, hs.owner, hs.metadata::text, extract(epoch FROM hs.expires_at - clock_timestamp())::float8, hs.mode::int, 0, false
FROM hs WHERE NOT EXISTS (SELECT 1 FROM ins) AND NOT EXISTS (SELECT 1 FROM mine)
UNION ALL
SELECT 'info', 0, '', '{}', 0, coalesce((SELECT k.hmode FROM k), 0)::int, coalesce((SELECT k.hlimit FROM k), 0)::int,
	(SELECT ok.go FROM ok)`
	for attempt := 1; ; attempt++ {
		var (
			got, raced    bool
			token         int64
			left          time.Duration // a retry's own lease: the time left on it
			holders       []dlock.Holder
			hmode, hlimit int
		)
		scan := func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				var (
					kind, owner, hmd string
					tok              int64
					leftS            float64
					mode, lim        int
					goOn             bool
				)
				if err := rows.Scan(&kind, &tok, &owner, &hmd, &leftS, &mode, &lim, &goOn); err != nil {
					return err
				}
				switch kind {
				case "won":
					got, token = true, tok
				case "mine":
					got, token, left = true, tok, time.Duration(leftS*1000)*time.Millisecond
				case "held":
					holders = append(holders, holderOf(owner, tok, hmd, leftS, mode))
				case "info":
					hmode, hlimit, raced = mode, lim, goOn
				}
			}
			return rows.Err()
		}
		args := []any{b.stmt.get(), req.Key, req.Owner, req.TTL.Milliseconds(), md, int(req.Mode), req.Limit}
		rctx, cancel := b.rpc(ctx)
		sent := time.Now()
		err := b.attemptStatement(rctx, attempt, req.Key, sql, args, scan)
		cancel()
		if err != nil {
			return driver.Grant{}, b.silent(ctx, fmt.Sprintf("acquire %q", req.Key), outage(fmt.Errorf("dlock: postgres acquire %q (%s): %w", req.Key, req.Mode, explain(err))))
		}
		b.answered(sent)
		if got {
			// The lease's validity began with this statement, not with
			// the attempt's first. A retry that found its own lease
			// (granted by an earlier statement) is valid for the time
			// left on it, counted from this statement.
			g := driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, mode: req.Mode}, Token: uint64(token), Start: sent}
			if left != 0 {
				if left < time.Millisecond {
					left = time.Millisecond
				}
				g.TTL = left
			}
			return g, nil
		}
		limited := req.Mode == driver.Limited && driver.Mode(hmode) == driver.Limited
		if limited && hlimit != req.Limit && len(holders) > 0 && holders[0].Mode == dlock.Limited {
			return driver.Grant{}, fmt.Errorf("%w: postgres key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, req.Key, hlimit, req.Limit)
		}
		// raced: the snapshot allowed the grant but the key's row had
		// changed under it; read again, now holding the row's lock, so
		// that no other grant can come between (only a row created
		// after the lock was asked for can race it), a bounded number
		// of times.
		if raced && attempt < attemptRetries && ctx.Err() == nil {
			continue
		}
		// Held, or (a Shared request) kept out by a waiting writer.
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: holders}
	}
}

// abortShared marks req.Owner's holder row released, if an attempt whose
// outcome is unknown wrote one, and wakes the key's waiters. If the
// attempt wrote nothing (yet), it leaves a released row for the owner in
// its place, a tombstone: the attempt's statement may still be on its way
// (held by a stalled link, delivered when it heals), and a grant never
// goes to an owner with a released row, so the late statement grants
// nothing instead of a holder row nobody renews or releases, which would
// keep its permit for a full TTL. Tombstones are deleted with the other
// released rows, five minutes on.
func (b *backend) abortShared(ctx context.Context, req *driver.Request) error {
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	_, err := b.pool.Exec(rctx, `WITH r AS (
	INSERT INTO `+b.n.holders+` AS h (key, owner, mode, token, expires_at, released)
	VALUES ($1, $2, $4::int, 0, clock_timestamp(), true)
	ON CONFLICT (key, owner) DO UPDATE SET expires_at = least(h.expires_at, clock_timestamp()), released = true
	WHERE NOT h.released
	RETURNING key
)
SELECT pg_notify($3, key) FROM r`, b.stmt.get(), req.Key, req.Owner, b.n.channelName(), int(req.Mode))
	if err != nil {
		return outage(fmt.Errorf("dlock: postgres abort %q: %w", req.Key, explain(err)))
	}
	return nil
}

// releaseShared marks a shared or limited holder's row released (expiry
// set to now), only while it is this owner's live lease, and notifies the
// key's waiters, in one statement. It reports whether the row was
// released, by this call or an earlier one whose reply was lost.
func (b *backend) releaseShared(ctx context.Context, key, owner string) (bool, error) {
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	var released, notified int64
	var before bool
	sent := time.Now()
	release := func() error {
		return b.pool.QueryRow(rctx, `WITH r AS (
	UPDATE `+b.n.holders+` SET expires_at = clock_timestamp(), released = true
	WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp() AND NOT released
	RETURNING key
), n AS (SELECT pg_notify($3, `+b.wakePayload("r.key", "$2", "")+`) FROM r)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM n),
	EXISTS (SELECT 1 FROM `+b.n.holders+` WHERE key = $1 AND owner = $2 AND released)`,
			b.stmt.get(), key, owner, b.n.channelName()).Scan(&released, &notified, &before)
	}
	err := release()
	if err != nil && b.noWakeColumn(err) {
		err = release()
	}
	if err != nil {
		return false, err
	}
	b.answered(sent)
	return released > 0 || before, nil
}
