// Acquiring: one statement takes a free or expired key, or reports its
// holder.

package pglock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Try implements driver.Driver in one statement: read the key's live
// lease (from the statement's snapshot) and report its holder; only if
// there is none, insert the key, or take over a row whose lease expired
// (or was released) by the database's clock, with the next token of the
// table's sequence. An attempt that finds the key held is thus a read: it
// locks no row, draws no token, takes no transaction id and writes no
// WAL, and does not queue behind the holder's release or renewal. A row
// that the snapshot shows expired but that a concurrent takeover renewed
// is seen by the insert's conflict check (which reads the row's latest
// version under its lock) and left alone: the statement then returns no
// row, and the key is reported held. A takeover draws its token
// while it holds the row's lock, so a key's tokens increase in the order
// it is granted; rows are never deleted by pglock (a release marks the
// row), so a key's next grant is always a takeover. (A first insert draws
// its token before it inserts: two first inserts racing end with one
// insert and one takeover, whose token is drawn after.) The lease's expiry is the database's clock plus
// the TTL, so a client whose clock is wrong does not shorten or lengthen
// anyone's lease.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	for k, v := range req.Metadata {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return driver.Grant{}, fmt.Errorf("%w: postgres acquire %q: metadata %q holds a NUL byte, which PostgreSQL's jsonb cannot store", dlock.ErrInvalidOption, req.Key, k)
		}
	}
	if err := b.ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	md, err := json.Marshal(req.Metadata)
	if err != nil {
		return driver.Grant{}, err
	}
	t := b.n.table
	sql := `WITH live AS (
	SELECT h.token, h.owner, h.metadata, h.expires_at FROM ` + t + ` h
	WHERE h.key = $1 AND h.expires_at > clock_timestamp()
), taken AS (
	INSERT INTO ` + t + ` AS l (key, owner, token, expires_at, metadata, acquired_at)
	SELECT $1, $2, nextval('` + b.n.sequence + `'), clock_timestamp() + $3 * interval '1 millisecond', $4::text::jsonb, clock_timestamp()
	WHERE NOT EXISTS (SELECT 1 FROM live)
	ON CONFLICT (key) DO UPDATE
		SET owner = EXCLUDED.owner, token = nextval('` + b.n.sequence + `'), expires_at = EXCLUDED.expires_at,
		    metadata = EXCLUDED.metadata, acquired_at = EXCLUDED.acquired_at
		WHERE l.expires_at <= clock_timestamp()
	RETURNING token
)
SELECT true, token, '', '{}', 0::float8 FROM taken
UNION ALL
SELECT false, h.token, h.owner, h.metadata::text, extract(epoch FROM h.expires_at - clock_timestamp())::float8
FROM live h WHERE NOT EXISTS (SELECT 1 FROM taken)`
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	sent := time.Now()
	var (
		won   bool
		token int64
		owner string
		hmd   []byte
		leftS float64
	)
	err = b.pool.QueryRow(rctx, sql, b.mode, req.Key, req.Owner, req.TTL.Milliseconds(), string(md)).Scan(&won, &token, &owner, &hmd, &leftS)
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		b.answered(sent)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// The key was taken by a transaction our snapshot does not see.
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key}
	}
	if err != nil {
		return driver.Grant{}, b.silent(ctx, fmt.Sprintf("acquire %q", req.Key), fmt.Errorf("dlock: postgres acquire %q: %w", req.Key, explain(err)))
	}
	if !won {
		h := dlock.Holder{Owner: owner, Token: uint64(token), Mode: dlock.Exclusive}
		_ = json.Unmarshal([]byte(hmd), &h.Metadata)
		if leftS > 0 {
			h.TTL = time.Duration(leftS * float64(time.Second))
		}
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{h}}
	}
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner}, Token: uint64(token)}, nil
}

// Abort implements driver.Aborter: delete req.Owner's row of req.Key, if
// an attempt whose outcome is unknown wrote one.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	_, err := b.pool.Exec(rctx, `UPDATE `+b.n.table+` SET expires_at = '-infinity' WHERE key = $1 AND owner = $2`, b.mode, req.Key, req.Owner)
	if err != nil {
		return fmt.Errorf("dlock: postgres abort %q: %w", req.Key, explain(err))
	}
	return nil
}
