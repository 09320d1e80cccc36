// Breaking: an operator's removal of a lock's holders (dlock.Break), and
// the notice that tells the broken holders' Lockers.

package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Break implements dlock.Breaker (see dlock.Break), in one transaction: it
// locks the key's row in the lease table (as every grant and every renewal
// of a shared or limited holder does, so none can come between), then ends
// the live exclusive lease, or every live shared or limited holder row
// (owner ""), or owner's alone: their expiry is set to the database's
// clock, as if they had expired then, which is not a release (a release
// leaves -infinity, or the released flag, for its retry to find), so the
// broken holders' Release reports the lock lost. It bumps the key row's
// gen, so that a grant deciding on an earlier snapshot is run again, and
// notifies the key's waiters. Tokens come from the sequence: the next
// holder's is above every broken one's. Waiting writers' rows stay.
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	if err := b.ready(ctx); err != nil {
		return driver.BreakResult{}, err
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	sent := time.Now()
	res, err := b.breakTx(rctx, key, owner)
	if err != nil {
		return driver.BreakResult{}, fmt.Errorf("dlock: postgres break %q: %w", key, explain(err))
	}
	b.answered(sent)
	return res, nil
}

func (b *backend) breakTx(ctx context.Context, key, owner string) (res driver.BreakResult, err error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	var (
		xOwner, xMD string
		xToken      int64
		xLeft       float64
		xLive       bool
	)
	err = tx.QueryRow(ctx, `SELECT owner, token, metadata::text,
	CASE WHEN expires_at > clock_timestamp() THEN extract(epoch FROM expires_at - clock_timestamp())::float8 ELSE 0 END,
	expires_at > clock_timestamp()
FROM `+b.n.table+` WHERE key = $1 FOR UPDATE`, b.stmt.get(), key).Scan(&xOwner, &xToken, &xMD, &xLeft, &xLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, tx.Rollback(ctx) // never locked
	}
	if err != nil {
		return res, err
	}
	var removedOwners []string
	if xLive {
		h := held(holderOf(xOwner, xToken, xMD, xLeft, int(driver.Exclusive)))
		if owner != "" && xOwner != owner {
			res.Others = append(res.Others, h)
			return res, tx.Rollback(ctx)
		}
		res.Removed = append(res.Removed, h)
		_, err = tx.Exec(ctx, `UPDATE `+b.n.table+` SET expires_at = clock_timestamp(), gen = gen + 1 WHERE key = $1`, b.stmt.get(), key)
	} else {
		var rows pgx.Rows
		rows, err = tx.Query(ctx, `SELECT owner, token, metadata::text,
	extract(epoch FROM expires_at - clock_timestamp())::float8, mode::int
FROM `+b.n.holders+` WHERE key = $1 AND expires_at > clock_timestamp() AND NOT released
ORDER BY token FOR UPDATE`, b.stmt.get(), key)
		if err != nil {
			return res, err
		}
		for rows.Next() {
			var (
				o, md string
				tok   int64
				left  float64
				mode  int
			)
			if err = rows.Scan(&o, &tok, &md, &left, &mode); err != nil {
				rows.Close()
				return res, err
			}
			h := held(holderOf(o, tok, md, left, mode))
			if owner != "" && o != owner {
				res.Others = append(res.Others, h)
				continue
			}
			res.Removed = append(res.Removed, h)
			removedOwners = append(removedOwners, o)
		}
		rows.Close()
		if err = rows.Err(); err != nil {
			return res, err
		}
		if len(res.Removed) == 0 {
			return res, tx.Rollback(ctx)
		}
		res.Others = nil
		_, err = tx.Exec(ctx, `WITH h AS (
	UPDATE `+b.n.holders+` SET expires_at = clock_timestamp() WHERE key = $1 AND owner = ANY($2::text[]) AND NOT released
)
UPDATE `+b.n.table+` SET gen = gen + 1 WHERE key = $1`, b.stmt.get(), key, removedOwners)
	}
	if err != nil {
		return res, err
	}
	// The waiters' notice, and the broken holders' (see breakNotice).
	if _, err = tx.Exec(ctx, `SELECT pg_notify($1, $2), pg_notify($1, $3)`, b.stmt.get(), b.n.channelName(), key, breakNotice+key); err != nil {
		return res, err
	}
	return res, tx.Commit(ctx)
}

// held converts a holder for the driver.
func held(h dlock.Holder) driver.Held {
	return driver.Held{Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: driver.Mode(h.Mode)}
}

// breakNotice prefixes the key in the notice a Break sends besides the
// waiters' (the key alone). The waiters of a key that itself begins with
// it are woken by that notice too (for nothing), and a holder of the rest
// of such a key reads its row on its release (for nothing); nobody
// decides anything from a notice. A Break by a pglock without break
// notices (an older version) is found by the holders' next renewal.
const breakNotice = "dlock-break:"
