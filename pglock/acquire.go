// Acquiring: one statement takes a free or expired key, or reports its
// holder; Abort undoes an attempt whose outcome is unknown; a blocking
// exclusive Acquire registers as a waiting writer (register) and Leave
// withdraws it.

package pglock

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
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
// row, and the attempt reads again (see attemptRetries), so a key freed
// meanwhile is taken and a key taken meanwhile is reported with its
// holder. A takeover draws its token while it holds the row's lock, so a
// key's tokens increase in the order it is granted; rows are never
// deleted by pglock (a release marks the row), so a key's next grant is
// always a takeover. (A first insert draws its token before it inserts:
// two first inserts racing end with one insert and one takeover, whose
// token is drawn after.) The lease's expiry is the database's clock plus
// the TTL, so a client whose clock is wrong does not shorten or lengthen
// anyone's lease. A key with live shared or limited holders (holders
// table) is held too, and a takeover needs the key row's gen unchanged
// since the snapshot (see tryShared). Shared and Limited requests go to
// tryShared.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	for k, v := range req.Metadata {
		if strings.IndexByte(k, 0) >= 0 || strings.IndexByte(v, 0) >= 0 {
			return driver.Grant{}, fmt.Errorf("%w: postgres acquire %q: metadata %q holds a NUL byte, which PostgreSQL's jsonb cannot store", dlock.ErrInvalidOption, req.Key, k)
		}
	}
	if err := b.ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	mdb, err := json.Marshal(req.Metadata)
	if err != nil {
		return driver.Grant{}, err
	}
	md := string(mdb)
	if req.Mode != driver.Exclusive {
		return b.tryShared(ctx, req, md)
	}
	t := b.n.table
	// The key's row as the snapshot shows it (k), its live exclusive
	// lease (live) and its live shared or limited holders (readers). A
	// takeover also needs the row's gen unchanged since the snapshot: a
	// shared or limited grant, or a renewal of one, committed meanwhile
	// bumped it, and the snapshot's readers may be stale. A blocking
	// Acquire that registered as a waiting writer (see register) removes
	// its registration, and the key's expired ones, when it is granted
	// ($5, Request.Waiter), and leaves a tombstone for it (see Leave);
	// other attempts run without that part.
	unreg := b.registered(req.Key, req.Waiter)
	if b.l != nil && req.WaitID != "" && req.Waiter != "" {
		// Tie the wait to its registration before the attempt: a release
		// naming it may come before the attempt's refusal returns.
		b.l.tag(req.Key, req.WaitID, req.Waiter)
	}
	sql := `WITH k AS (
	SELECT h.token, h.owner, h.metadata, h.expires_at, h.gen FROM ` + t + ` h WHERE h.key = $1
), live AS (
	SELECT * FROM k WHERE k.expires_at > clock_timestamp()
), readers AS (
	SELECT r.token, r.owner, r.metadata, r.expires_at, r.mode FROM ` + b.n.holders + ` r
	WHERE r.key = $1 AND r.expires_at > clock_timestamp() AND NOT r.released
), taken AS (
	INSERT INTO ` + t + ` AS l (key, owner, token, expires_at, metadata, acquired_at)
	SELECT $1, $2, nextval('` + b.n.sequence + `'), clock_timestamp() + $3 * interval '1 millisecond', $4::text::jsonb, clock_timestamp()
	WHERE NOT EXISTS (SELECT 1 FROM live) AND NOT EXISTS (SELECT 1 FROM readers)
	  AND NOT EXISTS (SELECT 1 FROM ` + b.n.holders + ` u WHERE u.key = $1 AND u.owner = $2 AND u.released)
	ON CONFLICT (key) DO UPDATE
		SET owner = EXCLUDED.owner, token = nextval('` + b.n.sequence + `'), expires_at = EXCLUDED.expires_at,
		    metadata = EXCLUDED.metadata, acquired_at = EXCLUDED.acquired_at
		WHERE l.expires_at <= clock_timestamp() AND l.gen = coalesce((SELECT k.gen FROM k), 0)
	RETURNING token
), gc AS (
	DELETE FROM ` + b.n.holders + ` g
	WHERE g.key = $1 AND g.expires_at < clock_timestamp() - interval '5 minutes' AND EXISTS (SELECT 1 FROM taken)
)`
	args := []any{b.stmt.get(), req.Key, req.Owner, req.TTL.Milliseconds(), md}
	if unreg {
		sql += `, unreg AS (
	DELETE FROM ` + b.n.writers + ` w
	WHERE w.key = $1 AND (w.waiter = $5 OR w.expires_at <= clock_timestamp()) AND EXISTS (SELECT 1 FROM taken)
), tomb AS (
	INSERT INTO ` + b.n.holders + ` (key, owner, mode, token, expires_at, released)
	SELECT $1, $5, 0, 0, clock_timestamp(), true FROM taken
	ON CONFLICT (key, owner) DO NOTHING
)`
		args = append(args, req.Waiter)
	}
	sql += `
SELECT true, token, '', '{}', 0::float8, 0::int FROM taken
UNION ALL
SELECT false, h.token, h.owner, h.metadata::text, extract(epoch FROM h.expires_at - clock_timestamp())::float8, 0
FROM live h WHERE NOT EXISTS (SELECT 1 FROM taken)
UNION ALL
SELECT false, r.token, r.owner, r.metadata::text, extract(epoch FROM r.expires_at - clock_timestamp())::float8, r.mode::int
FROM readers r WHERE NOT EXISTS (SELECT 1 FROM taken)`
	var (
		won     bool
		token   int64
		holders []dlock.Holder
	)
	scan := func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var (
				w     bool
				tok   int64
				owner string
				hmd   string
				leftS float64
				mode  int
			)
			if err := rows.Scan(&w, &tok, &owner, &hmd, &leftS, &mode); err != nil {
				return err
			}
			if w {
				won, token = true, tok
				continue
			}
			holders = append(holders, holderOf(owner, tok, hmd, leftS, mode))
		}
		return rows.Err()
	}
	for attempt := 1; ; attempt++ {
		won, token, holders = false, 0, nil
		rctx, cancel := b.rpc(ctx)
		sent := time.Now()
		err := b.attemptStatement(rctx, attempt, req.Key, sql, args, scan)
		cancel()
		if err != nil {
			return driver.Grant{}, b.silent(ctx, fmt.Sprintf("acquire %q", req.Key), outage(fmt.Errorf("dlock: postgres acquire %q: %w", req.Key, explain(err))))
		}
		b.answered(sent)
		if won {
			break
		}
		// Not taken, and no holder in the snapshot: a transaction the
		// snapshot does not see changed the key's row (a grant, or a
		// reader's renewal or release bumping gen). Read again (see
		// attemptRetries), a bounded number of times.
		if len(holders) == 0 && attempt < attemptRetries && ctx.Err() == nil {
			continue
		}
		// Held (the holders listed), or, with none listed, taken or
		// changed by transactions at every try.
		if req.Waiter != "" {
			b.register(ctx, req)
		}
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: holders}
	}
	if unreg {
		b.forget(req.Key, req.Waiter)
	}
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, mode: driver.Exclusive}, Token: uint64(token)}, nil
}

// attemptRetries bounds the statements one attempt runs. The first is
// one statement; if the key's row changed between its snapshot and its
// lock (another grant, or a reader's renewal or release, on the key), so
// that the snapshot's holders could not be trusted, the attempt runs the
// statement once more (a new snapshot, which sees what raced it; a
// contended handoff's losers end here, listing the winner), and if that
// races too, reads holding the row's lock (see locked), which only a row
// created in the meantime can race. After that many the attempt reports
// the holders it saw.
const attemptRetries = 4

// holderOf is a holder as a statement reports it.
func holderOf(owner string, token int64, md string, leftS float64, mode int) dlock.Holder {
	h := dlock.Holder{Owner: owner, Token: uint64(token), Mode: dlock.Mode(mode)}
	_ = json.Unmarshal([]byte(md), &h.Metadata)
	if leftS > 0 {
		h.TTL = time.Duration(leftS * float64(time.Second))
	}
	return h
}

// attemptStatement runs the statement of an attempt's attempt-th try
// (see attemptRetries): the first two as one statement, which spends no
// round trip on a lock when no other grant comes between its snapshot
// and its upsert; later ones holding the key's row lock (see locked).
func (b *backend) attemptStatement(ctx context.Context, attempt int, key, sql string, args []any, scan func(pgx.Rows) error) error {
	if attempt > 2 {
		return b.locked(ctx, key, sql, args, scan)
	}
	rows, err := b.pool.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	return scan(rows)
}

// locked runs an attempt's statement sql in a READ COMMITTED transaction
// that first locks the key's row: the statement's snapshot, taken once
// the lock is held, has the row's latest gen and the holders it counts,
// and every other grant or renewal on the key waits for the
// transaction's commit, so the attempt cannot race them. Taking the lock
// costs round trips, so it is only for an attempt whose one-statement
// form raced twice. The transaction holds the row's lock across client
// round trips, so the server bounds it: a client that stalls inside it
// (a paused process, a cut link) loses its session once it has been idle
// for the request timeout (idle_in_transaction_session_timeout; so the
// row is held at most about twice the request timeout), and a lock wait
// longer than that fails (lock_timeout), instead of keeping the key and
// its holder's renewals waiting until the connection dies.
func (b *backend) locked(ctx context.Context, key, sql string, args []any, scan func(pgx.Rows) error) (err error) {
	ms := min(max(b.timeout.Milliseconds(), 1), math.MaxInt32) // the settings' range
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: fmt.Sprintf(
		"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = %d; SET LOCAL lock_timeout = %d", ms, ms)})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	if _, err = tx.Exec(ctx, `SELECT 1 FROM `+b.n.table+` WHERE key = $1 FOR UPDATE`, b.stmt.get(), key); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	if err = scan(rows); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Abort implements driver.Aborter: mark req.Owner's lease of req.Key
// released, if an attempt whose outcome is unknown wrote one, and leave a
// tombstone for the owner in the holders table (see abortShared), so that
// the attempt's statement, if it reaches the server only now (held by a
// stalled link), takes nothing: Try never grants an owner with a released
// holder row.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	if req.Mode != driver.Exclusive {
		return b.abortShared(ctx, req)
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	_, err := b.pool.Exec(rctx, `WITH x AS (
	UPDATE `+b.n.table+` SET expires_at = '-infinity' WHERE key = $1 AND owner = $2
	RETURNING key
), t AS (
	INSERT INTO `+b.n.holders+` AS h (key, owner, mode, token, expires_at, released)
	VALUES ($1, $2, 0, 0, clock_timestamp(), true)
	ON CONFLICT (key, owner) DO NOTHING
)
SELECT count(*) FROM x`, b.stmt.get(), req.Key, req.Owner)
	if err != nil {
		return outage(fmt.Errorf("dlock: postgres abort %q: %w", req.Key, explain(err)))
	}
	return nil
}

// waiterKey names a waiting writer's registration.
type waiterKey struct{ key, waiter string }

// register records req's Acquire as a waiting writer of req.Key after a
// refused attempt, in a statement of its own: a row in the writers table
// expiring req.TTL after the database's clock. Later refused attempts of
// the same Acquire renew it once a third of the TTL has passed since the
// last registration was sent (the engine attempts at least every TTL/3,
// so a live writer's row never expires; a dead writer's expires a TTL
// after its last registration). An error is not reported: the attempt's
// own outcome stands, and the next refused attempt tries again.
func (b *backend) register(ctx context.Context, req *driver.Request) {
	// A wait that listens (its attempts carry its subscription's WaitID,
	// tied to it by Try) registers as one a release may wake by name
	// (wake), and re-registers at once when it starts listening.
	wake := b.l != nil && req.WaitID != "" && b.l.gaveUp() == nil
	k := waiterKey{req.Key, req.Waiter}
	now := time.Now()
	b.regMu.Lock()
	if last, ok := b.regs[k]; ok && now.Sub(last.at) < req.TTL/3 && last.wake == wake {
		b.regMu.Unlock()
		return
	}
	if b.regs == nil {
		b.regs = map[waiterKey]registration{}
	}
	// Recorded before the statement is sent: a registration whose reply
	// is lost is still withdrawn by the grant or by Leave.
	b.regs[k] = registration{at: now, wake: wake}
	b.regMu.Unlock()
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	// A waiter that left (Leave) or was granted the key has a released
	// row in the holders table under its id: a registration arriving
	// after that (held by a stalled link) registers nothing.
	reg := func() error {
		if b.wakeOff.Load() {
			_, err := b.pool.Exec(rctx, `INSERT INTO `+b.n.writers+` (key, waiter, expires_at)
SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'
WHERE NOT EXISTS (SELECT 1 FROM `+b.n.holders+` u WHERE u.key = $1 AND u.owner = $2 AND u.released)
ON CONFLICT (key, waiter) DO UPDATE SET expires_at = EXCLUDED.expires_at`, b.stmt.get(), req.Key, req.Waiter, req.TTL.Milliseconds())
			return err
		}
		_, err := b.pool.Exec(rctx, `INSERT INTO `+b.n.writers+` (key, waiter, expires_at, wake)
SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond', $4
WHERE NOT EXISTS (SELECT 1 FROM `+b.n.holders+` u WHERE u.key = $1 AND u.owner = $2 AND u.released)
ON CONFLICT (key, waiter) DO UPDATE SET expires_at = EXCLUDED.expires_at, wake = EXCLUDED.wake`, b.stmt.get(), req.Key, req.Waiter, req.TTL.Milliseconds(), wake)
		return err
	}
	err := reg()
	if err != nil && b.noWakeColumn(err) {
		err = reg()
	}
	if err != nil {
		b.regMu.Lock()
		if _, ok := b.regs[k]; ok {
			b.regs[k] = registration{} // try again at the next refused attempt
		}
		b.regMu.Unlock()
	}
}

// registration is when this Locker last registered a waiting writer, and
// whether as one a release may wake by name.
type registration struct {
	at   time.Time
	wake bool
}

// registered reports whether this Locker may have registered waiter as a
// waiting writer of key.
func (b *backend) registered(key, waiter string) bool {
	if waiter == "" {
		return false
	}
	b.regMu.Lock()
	defer b.regMu.Unlock()
	_, ok := b.regs[waiterKey{key, waiter}]
	return ok
}

// forget drops waiter's registration from the Locker's record (its row
// was deleted).
func (b *backend) forget(key, waiter string) {
	b.regMu.Lock()
	delete(b.regs, waiterKey{key, waiter})
	b.regMu.Unlock()
}

// Leave implements driver.Leaver: remove waiter's registration as a
// waiting writer of key, and wake the key's waiters (readers it kept
// out). A waiter this Locker never registered costs no statement. It
// leaves a released row under the waiter's id in the holders table (a
// tombstone, deleted with the key's other released rows five minutes on),
// so that a registration of this waiter still on its way (held by a
// stalled link) registers nothing when it arrives.
func (b *backend) Leave(ctx context.Context, key, waiter string) error {
	if !b.registered(key, waiter) {
		return nil
	}
	if err := b.ready(ctx); err != nil {
		return err
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	leave := func() error {
		_, err := b.pool.Exec(rctx, `WITH d AS (
	DELETE FROM `+b.n.writers+` WHERE key = $1 AND waiter = $2 RETURNING key
), t AS (
	INSERT INTO `+b.n.holders+` (key, owner, mode, token, expires_at, released)
	VALUES ($1, $2, 0, 0, clock_timestamp(), true)
	ON CONFLICT (key, owner) DO NOTHING
)
SELECT pg_notify($3, `+b.wakePayload("d.key", "''", "$2")+`) FROM (SELECT DISTINCT key FROM d) d`, b.stmt.get(), key, waiter, b.n.channelName())
		return err
	}
	err := leave()
	if err != nil && b.noWakeColumn(err) {
		err = leave()
	}
	if err != nil {
		return outage(fmt.Errorf("dlock: postgres leave %q: %w", key, explain(err)))
	}
	b.forget(key, waiter)
	return nil
}
