// The held lock: a row owned by this attempt, renewed (Refresh,
// RefreshBatch) and released with owner-checked statements, and told of
// its loss (Bind: the held locks' watch, woken by break notices).

package pglock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
	sql, args := excl, []any{b.stmt.get(), keys, owners, ttls}
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
	release := func() error {
		return b.pool.QueryRow(rctx, `WITH r AS (
	UPDATE `+b.n.table+` SET expires_at = '-infinity'
	WHERE key = $1 AND owner = $2 AND expires_at > clock_timestamp()
	RETURNING key
), n AS (SELECT pg_notify($3, `+b.wakePayload("r.key", "$2", "")+`) FROM r)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM n),
	EXISTS (SELECT 1 FROM `+b.n.table+` WHERE key = $1 AND owner = $2 AND expires_at = '-infinity')`,
			b.stmt.get(), l.key, l.owner, b.n.channelName()).Scan(&released, &notified, &before)
	}
	err := release()
	if err != nil && b.noWakeColumn(err) {
		err = release()
	}
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

// breakListenDelay is how long a lock is held before it listens for the
// notices a dlock.Break sends. Most locks are held for less: they cost
// nothing, and a break of one is found by its release or renewal.
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, its lease joins the Locker's watch (heldWatch), which
// is told by the LISTEN connection of each break of a key (Break sends a
// notice of its own, breakNotice) and then reads, in one statement, the
// rows of the Locker's holders of that key: a holder whose row is no
// longer its live lease is lost at once (wrapping dlock.ErrNotHeld), not
// at its next renewal. The watch also reads the rows of every lock that
// joins it, and of all its locks whenever the LISTEN connection is
// opened again, so a break before either is found too. Without a LISTEN
// (WithoutListen, or a pooler in between, where NOTIFY does not cross)
// the next renewal finds the break. stop never waits.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	if l.b.l == nil {
		return nil
	}
	bd := &binding{l: l, lose: lose}
	t := time.AfterFunc(breakListenDelay, func() { l.b.held.add(bd) })
	return func() {
		t.Stop()
		l.b.held.remove(bd)
	}
}

// heldWatch is a Locker's watch of its locks held for longer than
// breakListenDelay: while it has any, it keeps the LISTEN connection open
// (a subscription of its own) and one goroutine, which reads the rows of
// the locks of each key a break notice names, or of all of them once the
// LISTEN connection is (re)opened, one statement per round.
type heldWatch struct {
	b *backend
	// hook, when set (by tests), runs after each round that had leases to
	// check, with whether its statement succeeded.
	hook atomic.Pointer[func(ok bool)]

	mu     sync.Mutex
	leases map[*binding]struct{}
	dirty  map[string]bool // keys named by break notices since the last round
	all    bool            // check every lease in the next round
	kick   chan struct{}   // a round is due (buffered, sent without blocking)
	cancel context.CancelFunc
}

// binding is one lock's place in the watch.
type binding struct {
	l       *lease
	lose    func(cause error)
	joined  bool // due for a check of its own (joined, or its round failed); h.mu
	stopped bool // the lock ended: never (re)joins; h.mu
}

func (h *heldWatch) add(bd *binding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if bd.stopped || h.b.l.gaveUp() != nil {
		return
	}
	if h.leases == nil {
		h.leases, h.dirty = map[*binding]struct{}{}, map[string]bool{}
	}
	if len(h.leases) == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		h.kick = make(chan struct{}, 1) // this run's: an ending run may linger
		// Not background work: it lasts as long as the Locker holds locks.
		go h.run(ctx, h.b.l.add(""), h.kick)
	}
	bd.joined = true
	h.leases[bd] = struct{}{}
	h.poke()
}

func (h *heldWatch) remove(bd *binding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	bd.stopped = true
	if _, ok := h.leases[bd]; !ok {
		return
	}
	delete(h.leases, bd)
	if len(h.leases) == 0 {
		h.cancel()
		clear(h.dirty)
		h.all = false
	}
}

// retry marks due, whose round failed, for the next round, which the
// run runs after a pause (heldRetry), and reports whether the run is
// over instead (its last lock left while the statement ran).
func (h *heldWatch) retry(ctx context.Context, due []*binding) (over bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, bd := range due {
		if _, ok := h.leases[bd]; ok {
			bd.joined = true
		}
	}
	return ctx.Err() != nil
}

// poke asks for a round; h.mu held.
func (h *heldWatch) poke() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// broken notes a break notice for key.
func (h *heldWatch) broken(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.leases) > 0 {
		h.dirty[key] = true
		h.poke()
	}
}

// run does the watch's rounds until ctx ends. s is its subscription to
// the LISTEN connection (a key no lock can have): it keeps the connection
// open and is woken when the connection is (re)opened.
func (h *heldWatch) run(ctx context.Context, s *sub, kick chan struct{}) {
	defer s.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.C():
			h.mu.Lock()
			h.all = true
			h.mu.Unlock()
		case <-kick:
		}
		if ctx.Err() != nil {
			return
		}
		if h.b.l.gaveUp() != nil {
			return // no NOTIFY can arrive: the renewals find a break
		}
		for !h.round(ctx) {
			// The statement failed (an outage, a pool exhausted): try
			// again after a pause, not at the next notice.
			t := time.NewTimer(heldRetry)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if h.b.l.gaveUp() != nil {
				return // a pooler found meanwhile: no NOTIFY can arrive
			}
		}
	}
}

// heldRetry is the pause before a failed round of the held locks' watch
// is run again.
const heldRetry = time.Second

// round reads the rows of the leases due for a check, in one statement
// bounded by the request timeout, and loses those whose row is not their
// live lease. An error decides nothing: the renewals report an outage.
func (h *heldWatch) round(ctx context.Context) (ok bool) {
	h.mu.Lock()
	if ctx.Err() != nil { // this run ended: another may have started
		h.mu.Unlock()
		return true
	}
	var due []*binding
	for bd := range h.leases {
		if h.all || bd.joined || h.dirty[bd.l.key] {
			bd.joined = false
			due = append(due, bd)
		}
	}
	h.all = false
	clear(h.dirty)
	h.mu.Unlock()
	if len(due) == 0 {
		return true
	}
	keys, owners, excl := make([]string, len(due)), make([]string, len(due)), make([]bool, len(due))
	for i, bd := range due {
		keys[i], owners[i], excl[i] = bd.l.key, bd.l.owner, bd.l.mode == driver.Exclusive
	}
	b := h.b
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	rows, err := b.pool.Query(rctx, `SELECT x.i FROM unnest($1::text[], $2::text[], $3::bool[]) WITH ORDINALITY AS x(key, owner, excl, i)
WHERE x.excl AND EXISTS (SELECT 1 FROM `+b.n.table+` l WHERE l.key = x.key AND l.owner = x.owner AND l.expires_at > clock_timestamp())
OR NOT x.excl AND EXISTS (SELECT 1 FROM `+b.n.holders+` r WHERE r.key = x.key AND r.owner = x.owner AND r.expires_at > clock_timestamp() AND NOT r.released)`,
		b.stmt.get(), keys, owners, excl)
	if err != nil {
		h.roundDone(false)
		return h.retry(ctx, due)
	}
	live := make([]bool, len(due))
	for rows.Next() {
		var i int64
		if err = rows.Scan(&i); err != nil {
			break
		}
		if i >= 1 && i <= int64(len(due)) {
			live[i-1] = true
		}
	}
	rows.Close()
	if err != nil || rows.Err() != nil {
		h.roundDone(false)
		return h.retry(ctx, due)
	}
	h.roundDone(true)
	for i, bd := range due {
		if !live[i] {
			// The core ignores a loss reported after the lock ended.
			bd.lose(bd.l.notHeld("broken, or expired on the server"))
		}
	}
	return true
}

// roundDone runs h's round hook, if a test set one (see heldWatch.hook).
func (h *heldWatch) roundDone(ok bool) {
	if hook := h.hook.Load(); hook != nil {
		(*hook)(ok)
	}
}
