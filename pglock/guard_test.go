package pglock_test

// Tests of the Guard, on real PostgreSQL servers (and PgBouncer in
// transaction pooling mode). Helpers are named guard* to keep apart from
// the Locker's tests in the same package.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// guardPool returns a pool on dsn, closed when the test ends.
func guardPool(t *testing.T, dsn string, params ...string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(params); i += 2 {
		cfg.ConnConfig.RuntimeParams[params[i]] = params[i+1]
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// guardServer gives the test a database of its own on the shared
// PostgreSQL server, runs MigrateGuard on it and returns it with a pool on
// it.
func guardServer(t *testing.T) (*pgDB, *pgxpool.Pool) {
	t.Helper()
	return guardServerOn(t, sharedPG(t))
}

// guardServerOn runs MigrateGuard on pg's database and returns a pool on it.
func guardServerOn(t *testing.T, pg *pgDB) (*pgDB, *pgxpool.Pool) {
	t.Helper()
	pool := guardPool(t, pg.DSN(""))
	if err := pglock.MigrateGuard(dlocktest.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	return pg, pool
}

// guardExec runs sql on pool, failing the test on error.
func guardExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(dlocktest.Context(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// guardBegin begins a transaction on pool, rolled back when the test ends
// if it is still open.
func guardBegin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(dlocktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func guardSuite(t *testing.T, dsn string) {
	newGuard := func(t *testing.T, opts ...driver.Option) guard.Guard {
		return pglock.NewGuard(guardPool(t, dsn), opts...)
	}
	guardtest.Run(t, newGuard, guardtest.Shared(func(t *testing.T, _ guard.Guard, opts ...driver.Option) guard.Guard {
		return newGuard(t, opts...) // its own pool on the same database
	}), guardtest.Stallable(func(t *testing.T) (guard.Guard, func()) {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		p := testserver.StartProxy(t, u.Host)
		u.Host = p.Addr()
		pool := guardPool(t, u.String())
		t.Cleanup(p.Heal) // before the pool closes, which would wait on the stalled link
		return pglock.NewGuard(pool), p.Stall
	}))
}

// The conformance suite, each guard instance on a pool of its own. Not
// parallel, nor TestGuardPgBouncer: the suite checks with goleak that its
// tests leave no goroutine behind, so it runs alone.
func TestGuard(t *testing.T) {
	pg, _ := guardServer(t)
	guardSuite(t, pg.DSN(""))
}

// The suite through PgBouncer in transaction pooling mode (no session
// state survives between transactions), MigrateGuard included.
func TestGuardPgBouncer(t *testing.T) {
	pg := sharedPG(t)
	b := bouncerFor(t, pg)
	if err := pglock.MigrateGuard(dlocktest.Context(t), guardPool(t, b.DSN(""))); err != nil {
		t.Fatal(err)
	}
	guardSuite(t, b.DSN(""))
}

// guardCheckStale fails unless err is the refusal of f for res with the given
// highest token.
func guardCheckStale(t *testing.T, err error, res string, f dlock.Fence, highest uint64) {
	t.Helper()
	var st *dlock.StaleTokenError
	if !errors.Is(err, dlock.ErrStaleToken) || !errors.As(err, &st) {
		t.Fatalf("got %v, want a *dlock.StaleTokenError", err)
	}
	if st.Resource != res || st.Token != f.Token || st.Owner != f.Owner || st.Highest != highest {
		t.Fatalf("got %+v, want resource %q token %d owner %q highest %d", *st, res, f.Token, f.Owner, highest)
	}
}

// guardInventory creates a business table the tests fence writes to.
func guardInventory(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	guardExec(t, pool, `CREATE TABLE IF NOT EXISTS inventory (sku text PRIMARY KEY, qty int NOT NULL, last_token numeric NOT NULL DEFAULT 0)`)
}

func guardQty(t *testing.T, pool *pgxpool.Pool, sku string) (qty int, lastToken string) {
	t.Helper()
	if err := pool.QueryRow(dlocktest.Context(t), `SELECT qty, last_token::text FROM inventory WHERE sku = $1`, sku).Scan(&qty, &lastToken); err != nil {
		t.Fatal(err)
	}
	return qty, lastToken
}

// guardDecrement is a fenced transaction: Check, then the business write.
func guardDecrement(ctx context.Context, g *pglock.Guard, tx pgx.Tx, sku string, f dlock.Fence) error {
	if err := g.Check(ctx, tx, "sku:"+sku, f); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE inventory SET qty = qty - 1, last_token = $2 WHERE sku = $1`, sku, f.Token)
	return err
}

// The point of the Guard: the check is part of the transaction that
// writes the business row, so a stale holder's write never commits, even
// when it wrote before checking or ignores the refusal.
func TestGuardInTransaction(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	guardInventory(t, pool)
	guardExec(t, pool, `INSERT INTO inventory (sku, qty) VALUES ('42', 10)`)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	res := "sku:42"
	a5, b6 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}

	commit := func(f dlock.Fence) {
		t.Helper()
		tx := guardBegin(t, pool)
		if err := guardDecrement(ctx, g, tx, "42", f); err != nil {
			t.Fatalf("decrement with %+v: %v", f, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	commit(a5)
	commit(a5) // the same holder again
	commit(b6) // the next holder
	if q, lt := guardQty(t, pool, "42"); q != 7 || lt != "6" {
		t.Fatalf("qty %d last_token %s, want 7 and 6", q, lt)
	}

	// The old holder comes back: it writes, then checks; the refusal
	// aborts the transaction, so its write cannot commit.
	tx := guardBegin(t, pool)
	if _, err := tx.Exec(ctx, `UPDATE inventory SET qty = 0, last_token = 5 WHERE sku = '42'`); err != nil {
		t.Fatal(err)
	}
	guardCheckStale(t, g.Check(ctx, tx, res, a5), res, a5, 6)
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("a statement after a refused Check succeeded")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit after a refused Check = %v, want pgx.ErrTxCommitRollback", err)
	}
	// It checks first, ignores the refusal and writes: nothing commits.
	tx = guardBegin(t, pool)
	guardCheckStale(t, guardDecrement(ctx, g, tx, "42", a5), res, a5, 6)
	_, _ = tx.Exec(ctx, `UPDATE inventory SET qty = 0 WHERE sku = '42'`)
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit after an ignored refusal succeeded")
	}
	if q, lt := guardQty(t, pool, "42"); q != 7 || lt != "6" {
		t.Fatalf("after the stale holder's transactions: qty %d last_token %s, want 7 and 6", q, lt)
	}

	// Inside a savepoint, a refusal aborts the savepoint only.
	tx = guardBegin(t, pool)
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	guardCheckStale(t, guardDecrement(ctx, g, sp, "42", a5), res, a5, 6)
	if err := sp.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO inventory (sku, qty) VALUES ('43', 1)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a rolled back savepoint: %v", err)
	}

	// A fenced read by a newer holder: Check, SELECT, commit. The
	// previous holder can no longer write.
	c7 := dlock.Fence{Token: 7, Owner: "c"}
	tx = guardBegin(t, pool)
	if err := g.Check(ctx, tx, res, c7); err != nil {
		t.Fatal(err)
	}
	var qty int
	if err := tx.QueryRow(ctx, `SELECT qty FROM inventory WHERE sku = '42'`).Scan(&qty); err != nil || qty != 7 {
		t.Fatalf("fenced read: %d, %v", qty, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx = guardBegin(t, pool)
	guardCheckStale(t, guardDecrement(ctx, g, tx, "42", b6), res, b6, 7)
	if hi, err := g.Highest(ctx, res); err != nil || hi != c7 {
		t.Fatalf("Highest = %+v, %v; want %+v", hi, err, c7)
	}

	// A rolled back transaction takes its fence back with it.
	d8 := dlock.Fence{Token: 8, Owner: "d"}
	tx = guardBegin(t, pool)
	if err := guardDecrement(ctx, g, tx, "42", d8); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != c7 {
		t.Fatalf("Highest after a rollback = %+v, %v; want %+v", hi, err, c7)
	}

	// Shared fences: admitted at or above the highest, never recorded.
	s9 := dlock.Fence{Token: 9, Owner: "s", Shared: true}
	tx = guardBegin(t, pool)
	if err := g.Check(ctx, tx, res, s9); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != c7 {
		t.Fatalf("Highest after a shared fence = %+v, %v; want %+v", hi, err, c7)
	}
	tx = guardBegin(t, pool)
	s6 := dlock.Fence{Token: 6, Owner: "s", Shared: true}
	guardCheckStale(t, g.Check(ctx, tx, res, s6), res, s6, 7)

	// Two resources in one transaction; the largest token is kept exactly.
	top := dlock.Fence{Token: math.MaxUint64, Owner: "top"}
	tx = guardBegin(t, pool)
	for _, r := range []string{"sku:42", "sku:43"} {
		if err := g.Check(ctx, tx, r, top); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var tokens string
	if err := pool.QueryRow(ctx, `SELECT string_agg(token::text, ',' ORDER BY resource) FROM dlock_fences WHERE resource IN ('sku:42', 'sku:43')`).Scan(&tokens); err != nil {
		t.Fatal(err)
	}
	if want := "18446744073709551615,18446744073709551615"; tokens != want {
		t.Fatalf("tokens in the table: %s, want %s", tokens, want)
	}
}

// Do: a fenced transaction in one call; fn's error or panic rolls back
// the fence and fn's writes.
func TestGuardDo(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	guardInventory(t, pool)
	guardExec(t, pool, `INSERT INTO inventory (sku, qty) VALUES ('7', 10)`)
	ctx := dlocktest.Context(t)
	var rec dlocktest.Recorder
	g := pglock.NewGuard(pool, dlock.WithObserver(&rec))
	res := "sku:7"
	dec := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE inventory SET qty = qty - 1 WHERE sku = '7'`)
		return err
	}
	a5, b6, c7 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}, dlock.Fence{Token: 7, Owner: "c"}
	if err := g.Do(ctx, res, b6, dec); err != nil {
		t.Fatal(err)
	}
	ran := false
	err := g.Do(ctx, res, a5, func(context.Context, pgx.Tx) error { ran = true; return nil })
	guardCheckStale(t, err, res, a5, 6)
	if ran {
		t.Fatal("fn ran with a refused fence")
	}
	if ev := rec.Events(); len(ev) != 1 || ev[0].Kind != dlock.EventRejected || ev[0].Backend != "postgres" || ev[0].Token != 5 || ev[0].Highest != 6 {
		t.Fatalf("observer: %+v, want one EventRejected for token 5", ev)
	}

	boom := errors.New("boom")
	if err := g.Do(ctx, res, c7, func(ctx context.Context, tx pgx.Tx) error {
		if err := dec(ctx, tx); err != nil {
			return err
		}
		return boom
	}); err != boom {
		t.Fatalf("Do = %v, want fn's error as is", err)
	}
	func() {
		defer func() {
			if r := recover(); r != "fn panicked" {
				t.Fatalf("recovered %v, want fn's panic", r)
			}
		}()
		_ = g.Do(ctx, res, c7, func(ctx context.Context, tx pgx.Tx) error {
			if err := dec(ctx, tx); err != nil {
				return err
			}
			panic("fn panicked")
		})
	}()
	if q, _ := guardQty(t, pool, "7"); q != 9 {
		t.Fatalf("qty %d after a failed and a panicking fn, want 9", q)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != b6 {
		t.Fatalf("Highest = %+v, %v; want %+v: fn's failure rolls the fence back", hi, err, b6)
	}
	// fn swallowed a failed statement: the commit fails.
	err = g.Do(ctx, res, c7, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Do after a swallowed failure = %v, want pgx.ErrTxCommitRollback", err)
	}
	if err := g.Do(ctx, res, c7, dec); err != nil {
		t.Fatal(err)
	}
	if q, _ := guardQty(t, pool, "7"); q != 8 {
		t.Fatalf("qty %d, want 8", q)
	}
	if st := pool.Stat(); st.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", st.AcquiredConns())
	}
}

// guardWaitBlocked waits (bounded) until n backends of pool's database
// wait for a lock while running a statement on the guard's table. It
// counts that database's backends alone: other tests' databases on a
// shared server have guard tables of their own, whose waits would make
// the count miss.
func guardWaitBlocked(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(dlocktest.HangTimeout)
	for {
		var waiting int
		err := pool.QueryRow(dlocktest.Context(t), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%dlock_fences%' AND pid <> pg_backend_pid()`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hang: %d backends wait for the fence row, want %d", waiting, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Check waits for the transaction that holds the resource's fence row:
// the newer holder's Check waits for the older one's commit and is
// admitted; the older one's Check, behind the newer one, is refused. Shared
// fences do not wait for each other; the next exclusive one waits for them.
func TestGuardCheckWaits(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	guardInventory(t, pool)
	guardExec(t, pool, `INSERT INTO inventory (sku, qty) VALUES ('1', 100)`)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	res := "sku:1"

	// started runs one fenced transaction in a goroutine: Check (which
	// waits), then the write, then commit; its result comes on the channel.
	started := func(f dlock.Fence) <-chan error {
		done := make(chan error, 1)
		tx := guardBegin(t, pool)
		go func() {
			err := guardDecrement(ctx, g, tx, "1", f)
			if err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(ctx)
			}
			done <- err
		}()
		return done
	}
	result := func(done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: the waiting transaction did not finish")
			return nil
		}
	}

	// The older holder checks first; the newer one waits, then wins.
	a5, b6 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}
	txA := guardBegin(t, pool)
	if err := guardDecrement(ctx, g, txA, "1", a5); err != nil {
		t.Fatal(err)
	}
	doneB := started(b6)
	guardWaitBlocked(t, pool, 1)
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(doneB); err != nil {
		t.Fatalf("the newer holder, after the older one committed: %v", err)
	}
	if q, lt := guardQty(t, pool, "1"); q != 98 || lt != "6" {
		t.Fatalf("qty %d last_token %s, want 98 and 6", q, lt)
	}

	// The newer holder checks first; the older one waits and is refused.
	c7, d8 := dlock.Fence{Token: 7, Owner: "c"}, dlock.Fence{Token: 8, Owner: "d"}
	txD := guardBegin(t, pool)
	if err := guardDecrement(ctx, g, txD, "1", d8); err != nil {
		t.Fatal(err)
	}
	doneC := started(c7)
	guardWaitBlocked(t, pool, 1)
	if err := txD.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	guardCheckStale(t, result(doneC), res, c7, 8)
	if q, lt := guardQty(t, pool, "1"); q != 97 || lt != "8" {
		t.Fatalf("qty %d last_token %s, want 97 and 8", q, lt)
	}

	// Shared holders check side by side (a second one waiting would make
	// this hang); the next exclusive holder waits for both.
	s9, s10 := dlock.Fence{Token: 9, Owner: "s1", Shared: true}, dlock.Fence{Token: 10, Owner: "s2", Shared: true}
	txS1, txS2 := guardBegin(t, pool), guardBegin(t, pool)
	if err := g.Check(ctx, txS1, res, s9); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, txS2, res, s10); err != nil {
		t.Fatal(err)
	}
	doneE := started(dlock.Fence{Token: 11, Owner: "e"})
	guardWaitBlocked(t, pool, 1)
	if err := txS1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	guardWaitBlocked(t, pool, 1)
	if err := txS2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(doneE); err != nil {
		t.Fatal(err)
	}
	if hi, err := g.Highest(ctx, res); err != nil || hi != (dlock.Fence{Token: 11, Owner: "e"}) {
		t.Fatalf("Highest = %+v, %v", hi, err)
	}
}

// guardCommitCheck checks f for res in a transaction of its own and
// commits it.
func guardCommitCheck(t *testing.T, ctx context.Context, g *pglock.Guard, pool *pgxpool.Pool, res string, f dlock.Fence) {
	t.Helper()
	tx := guardBegin(t, pool)
	if err := g.Check(ctx, tx, res, f); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// guardWantRefusedBehindReader runs a paused writer's Check of w in txW,
// which waits for the fence row that a reader's open transaction txR
// holds, then commits txR, and wants the writer refused below the
// reader's token, highest.
func guardWantRefusedBehindReader(t *testing.T, ctx context.Context, g *pglock.Guard, pool *pgxpool.Pool, txW, txR pgx.Tx, res string, w dlock.Fence, highest uint64) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- g.Check(ctx, txW, res, w) }()
	guardWaitBlocked(t, pool, 1)
	if err := txR.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		guardCheckStale(t, err, res, w, highest)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: the writer's Check never returned")
	}
}

// A writer that paused past its lease and checks again while a reader
// granted after it still holds its read lock waits for the reader's
// transaction and is refused.
// Symptom: the paused writer committed while the reader still held its read lock.
func TestGuardCheck_RefusesPausedWriterAfterReader(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	res := "paused-writer"
	w, r := dlock.Fence{Token: 5, Owner: "w"}, dlock.Fence{Token: 6, Owner: "r", Shared: true}
	guardCommitCheck(t, ctx, g, pool, res, w)
	txR := guardBegin(t, pool)
	if err := g.Check(ctx, txR, res, r); err != nil {
		t.Fatal(err)
	}
	txW2 := guardBegin(t, pool)
	guardWantRefusedBehindReader(t, ctx, g, pool, txW2, txR, res, w, r.Token)
}

// The same under REPEATABLE READ and SERIALIZABLE, the writer's snapshot
// taken before the reader checks and commits: the writer is refused.
// Symptom: the paused writer whose snapshot predated the reader's commit was admitted below the reader's token.
func TestGuardCheck_RefusesPausedWriterAfterReader_SnapshotIsolation(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			res := "paused-writer-" + string(iso)
			w, r := dlock.Fence{Token: 5, Owner: "w"}, dlock.Fence{Token: 6, Owner: "r", Shared: true}
			guardCommitCheck(t, ctx, g, pool, res, w)
			// The writer's transaction takes its snapshot before the
			// reader checks and commits.
			txW2, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = txW2.Rollback(context.Background()) })
			if _, err := txW2.Exec(ctx, `SELECT 1`); err != nil {
				t.Fatal(err)
			}
			txR := guardBegin(t, pool)
			if err := g.Check(ctx, txR, res, r); err != nil {
				t.Fatal(err)
			}
			guardWantRefusedBehindReader(t, ctx, g, pool, txW2, txR, res, w, r.Token)
		})
	}
}

// An exclusive Check under REPEATABLE READ whose Guard's pool reaches
// another database fails with an error wrapping dlock.ErrInvalidOption
// naming the Guard's pool.
// Symptom: the Check read that database's shared fences and admitted on them.
func TestGuardCheck_SnapshotIsolationRefusesAPoolOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	_, poolA := guardServer(t)
	_, poolB := guardServer(t)
	ctx := dlocktest.Context(t)
	tx, err := poolA.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	err = pglock.NewGuard(poolB).Check(ctx, tx, "other-db", dlock.Fence{Token: 1, Owner: "w"})
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "Guard's pool") {
		t.Fatalf("Check with the Guard's pool on another database = %v, want ErrInvalidOption naming the Guard's pool", err)
	}
}

// An exclusive Check under REPEATABLE READ on a pool whose only connection
// its transaction holds ends with its context, with an error wrapping
// dlock.ErrUnavailable that names the Guard's pool.
// Symptom: the Check waited for a second connection with an error blaming the fence row.
func TestGuardCheck_SnapshotIsolationNamesAnExhaustedPool(t *testing.T) {
	t.Parallel()
	pg, _ := guardServer(t)
	pool := guardPool(t, pg.DSN("")+"&pool_max_conns=1")
	ctx := dlocktest.Context(t)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = pglock.NewGuard(pool).Check(cctx, tx, "exhausted", dlock.Fence{Token: 1, Owner: "w"})
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Guard's pool") {
		t.Fatalf("Check with no free connection in the Guard's pool = %v, want ErrUnavailable with the deadline, naming the Guard's pool", err)
	}
}

// Put and Get on a server whose default isolation is REPEATABLE READ run
// under READ COMMITTED, on a pool of one connection.
// Symptom: they needed a second connection, and on a pool of one waited until ctx ended.
func TestGuardPut_ReadCommittedWhateverTheServerDefault(t *testing.T) {
	t.Parallel()
	pg, _ := guardServer(t)
	pool := guardPool(t, pg.DSN("")+"&pool_max_conns=1", "default_transaction_isolation", "repeatable read")
	g := pglock.NewGuard(pool)
	ctx := dlocktest.Context(t)
	w := dlock.Fence{Token: 1, Owner: "w"}
	if err := g.Put(ctx, "default-rr", w, "name", "v"); err != nil {
		t.Fatalf("Put on a pool of one, server default REPEATABLE READ: %v", err)
	}
	if v, ok, err := g.Get(ctx, "default-rr", w, "name"); err != nil || !ok || v != "v" {
		t.Fatalf("Get = %q, %v, %v", v, ok, err)
	}
}

// Two readers' SERIALIZABLE transactions, each with a shared Check, both
// commit.
// Symptom: one failed to commit: each check read the shared tokens the other wrote.
func TestGuardCheck_SerializableSharedChecksCommitTogether(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	for round := range 3 {
		res := fmt.Sprintf("serializable-readers-%d", round)
		// The fence row exists (a first check creates it, and a second
		// one waits for that creation to commit).
		if err := g.Put(ctx, res, dlock.Fence{Token: 1, Owner: "w"}, "n", "v"); err != nil {
			t.Fatal(err)
		}
		var txs [2]pgx.Tx
		for i := range txs {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			txs[i] = tx
		}
		for i, tx := range txs {
			if err := g.Check(ctx, tx, res, dlock.Fence{Token: uint64(10 + i), Owner: fmt.Sprint("r", i), Shared: true}); err != nil {
				t.Fatalf("round %d: shared Check %d: %v", round, i, err)
			}
		}
		for i, tx := range txs {
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("round %d: commit of reader %d: %v", round, i, err)
			}
		}
	}
}

// A resource that only ever has shared holders keeps one row in the shared
// table, which still fences a paused writer out.
// Symptom: it kept one row per holder, for ever.
func TestGuardCheck_SharedRowsStayFewWithoutWriters(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	res := "semaphore-only"
	for tok := uint64(1); tok <= 200; tok++ {
		if err := g.Put(ctx, res, dlock.Fence{Token: tok, Owner: "p", Shared: true}, "n", "v"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dlock_fences_shared WHERE resource = $1`, res).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 1 {
		t.Fatalf("%d rows in the shared table after 200 shared Puts one after the other, want 1", n)
	}
	// They still fence a paused writer out.
	err := g.Put(ctx, res, dlock.Fence{Token: 150, Owner: "w"}, "n", "stale")
	guardCheckStale(t, err, res, dlock.Fence{Token: 150, Owner: "w"}, 200)
}

// Transactions with different tokens race on one resource (through the
// server and through PgBouncer at once), at each isolation level: each
// admitted one sees, after its Check, only writes of lower tokens, so
// writes commit in token order, and the last write is the highest
// committed token's. Under READ COMMITTED the highest token always
// commits; under REPEATABLE READ and SERIALIZABLE a transaction may also
// fail with a serialization failure (SQLSTATE 40001), committing nothing.
func TestGuardCheckRace(t *testing.T) {
	t.Parallel()
	pg, direct := guardServer(t)
	guardInventory(t, direct)
	bouncer := guardPool(t, bouncerFor(t, pg).DSN(""))
	pools := []*pgxpool.Pool{direct, bouncer}
	ctx := dlocktest.Context(t)
	g := []*pglock.Guard{pglock.NewGuard(direct), pglock.NewGuard(bouncer)}
	const rounds, racers = 30, 4
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		var committed, refused, serialization int
		for round := range rounds {
			sku := fmt.Sprintf("race-%s-%d", iso, round)
			guardExec(t, direct, `INSERT INTO inventory (sku, qty) VALUES ($1, 0)`, sku)
			tokens := rand.Perm(racers)
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				mu    sync.Mutex
				wins  []uint64
			)
			for i := range racers {
				f := dlock.Fence{Token: uint64(tokens[i] + 1), Owner: "r" + strconv.Itoa(i)}
				wg.Go(func() {
					<-start
					err := func() error {
						tx, err := pools[i%2].BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
						if err != nil {
							return err
						}
						defer tx.Rollback(ctx)
						if err := g[i%2].Check(ctx, tx, "sku:"+sku, f); err != nil {
							return err
						}
						var last uint64
						if err := tx.QueryRow(ctx, `SELECT last_token FROM inventory WHERE sku = $1`, sku).Scan(&last); err != nil {
							return err
						}
						if last >= f.Token {
							t.Errorf("%s: token %d admitted after a write of token %d committed", iso, f.Token, last)
						}
						if _, err := tx.Exec(ctx, `UPDATE inventory SET qty = qty + 1, last_token = $2 WHERE sku = $1`, sku, f.Token); err != nil {
							return err
						}
						return tx.Commit(ctx)
					}()
					mu.Lock()
					defer mu.Unlock()
					var st *dlock.StaleTokenError
					var pgErr *pgconn.PgError
					switch {
					case err == nil:
						wins = append(wins, f.Token)
						committed++
					case errors.As(err, &st):
						if st.Highest <= f.Token {
							t.Errorf("%s: token %d refused with highest %d", iso, f.Token, st.Highest)
						}
						refused++
					case iso != pgx.ReadCommitted && errors.As(err, &pgErr) && pgErr.Code == "40001":
						serialization++
					default:
						t.Errorf("%s: token %d: %v", iso, f.Token, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			q, lt := guardQty(t, direct, sku)
			want := uint64(0)
			for _, w := range wins {
				want = max(want, w)
			}
			if q != len(wins) || lt != strconv.FormatUint(want, 10) || (iso == pgx.ReadCommitted && want != racers) {
				t.Fatalf("%s round %d: qty %d last_token %s after commits of %v", iso, round, q, lt, wins)
			}
		}
		t.Logf("%s: %d rounds of %d racers: %d committed, %d refused, %d serialization failures", iso, rounds, racers, committed, refused, serialization)
	}
}

// A Check waiting behind an open transaction ends with its context;
// transactions that check two resources in opposite orders deadlock, and
// the server aborts one of them; under REPEATABLE READ, a fence row
// changed after the snapshot is a serialization failure.
func TestGuardCheckConflicts(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	a5, b6 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}

	txA := guardBegin(t, pool)
	if err := g.Check(ctx, txA, "x", a5); err != nil {
		t.Fatal(err)
	}
	txB := guardBegin(t, pool)
	// The deadline starts once txB is open: a Check called with a context
	// already done tries nothing, and says so with the context's error.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := g.Check(short, txB, "x", b6)
	cancel()
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check behind an open transaction = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	_ = txB.Rollback(ctx) // the pool has 4 connections
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if hi, err := g.Highest(ctx, "x"); err != nil || hi != a5 {
		t.Fatalf("Highest = %+v, %v; want %+v", hi, err, a5)
	}

	// Deadlock: A checks p then q, B checks q then p.
	txA, txB = guardBegin(t, pool), guardBegin(t, pool)
	if err := g.Check(ctx, txA, "p", a5); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, txB, "q", b6); err != nil {
		t.Fatal(err)
	}
	errA := make(chan error, 1)
	go func() { errA <- g.Check(ctx, txA, "q", a5) }()
	guardWaitBlocked(t, pool, 1)
	errs := []error{g.Check(ctx, txB, "p", b6)}
	select {
	case err := <-errA:
		errs = append(errs, err)
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: deadlock not resolved")
	}
	deadlocks := 0
	for _, err := range errs {
		var pgErr *pgconn.PgError
		var st *dlock.StaleTokenError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "40P01":
			deadlocks++
		case err != nil && !errors.As(err, &st):
			t.Errorf("unexpected error: %v", err)
		}
	}
	if deadlocks != 1 {
		t.Fatalf("errors %v, want one deadlock (40P01)", errs)
	}
	_, _ = txA.Rollback(ctx), txB.Rollback(ctx)

	// REPEATABLE READ: the snapshot predates another transaction's fence.
	rr, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Rollback(ctx)
	if _, err := rr.Exec(ctx, `SELECT 1`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	if err := g.Put(ctx, "x", b6, "n", "v"); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	c7 := dlock.Fence{Token: 7, Owner: "c"}
	if err := g.Check(ctx, rr, "x", c7); !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("Check in a REPEATABLE READ transaction older than the fence = %v, want a serialization failure", err)
	}
}

// The suite with pgx's simple protocol (parameters interpolated by the
// client), as some poolers need.
func TestGuardSimpleProtocol(t *testing.T) {
	pg, _ := guardServer(t)
	guardSuite(t, pg.DSN("")+"&default_query_exec_mode=simple_protocol")
}

// BenchmarkGuardCheck measures a fenced transaction: begin, Check with a
// new token (an update of the fence row), commit.
func BenchmarkGuardCheck(b *testing.B) {
	pg := testserver.StartPostgres(b)
	pool, err := pgxpool.New(context.Background(), pg.DSN(""))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if err := pglock.MigrateGuard(ctx, pool); err != nil {
		b.Fatal(err)
	}
	g := pglock.NewGuard(pool)
	tok := uint64(0)
	b.ResetTimer()
	for b.Loop() {
		tok++
		err := g.Do(ctx, "bench", dlock.Fence{Token: tok, Owner: "b"}, func(context.Context, pgx.Tx) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
	}
}

// Tables migrated before the shared fences' table existed: a Check, in
// either mode, says to run MigrateGuard again and names the missing
// table.
// Symptom: the message named only the fence and values tables, which exist.
func TestGuardCheck_NamesSharedTableWhenMigrationIsOld(t *testing.T) {
	t.Parallel()
	_, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	guardExec(t, pool, `DROP TABLE `+pglock.DefaultGuardTable+pglock.GuardSharedSuffix)
	g := pglock.NewGuard(pool)
	err := g.Check(ctx, guardBegin(t, pool), "r", dlock.Fence{Token: 4, Owner: "s", Shared: true})
	if err == nil || !strings.Contains(err.Error(), "pglock.MigrateGuard") || !strings.Contains(err.Error(), pglock.DefaultGuardTable+pglock.GuardSharedSuffix) {
		t.Fatalf("shared Check without the shared fences' table = %v, want an error naming pglock.MigrateGuard and the table", err)
	}
	err = g.Check(ctx, guardBegin(t, pool), "r", dlock.Fence{Token: 3, Owner: "w"})
	if err == nil || !strings.Contains(err.Error(), pglock.DefaultGuardTable+pglock.GuardSharedSuffix) {
		t.Fatalf("exclusive Check without the shared fences' table = %v, want an error naming the table", err)
	}
	if err := pglock.MigrateGuard(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, guardBegin(t, pool), "r", dlock.Fence{Token: 4, Owner: "s", Shared: true}); err != nil {
		t.Fatalf("shared Check after MigrateGuard ran again = %v", err)
	}
}

// Bad input: errors wrapping the documented sentinels, never a panic.
func TestGuardBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := dlock.Fence{Token: 1, Owner: "o"}
	fn := func(context.Context, pgx.Tx) error { return errors.New("fn ran") }
	// every call of g, with valid arguments and tx.
	calls := func(g *pglock.Guard, tx pgx.Tx) map[string]error {
		_, herr := g.Highest(ctx, "r")
		_, _, gerr := g.Get(ctx, "r", f, "n")
		return map[string]error{
			"Highest": herr,
			"Put":     g.Put(ctx, "r", f, "n", "v"),
			"Get":     gerr,
			"Check":   g.Check(ctx, tx, "r", f),
			"Do":      g.Do(ctx, "r", f, fn),
		}
	}
	var nilGuard *pglock.Guard
	for name, g := range map[string]*pglock.Guard{
		"nil pool":   pglock.NewGuard(nil),
		"zero Guard": {},
		"nil Guard":  nilGuard,
	} {
		for call, err := range calls(g, nil) {
			if !errors.Is(err, dlock.ErrNilClient) {
				t.Errorf("%s: %s = %v, want ErrNilClient", name, call, err)
			}
		}
	}
	if err := pglock.MigrateGuard(ctx, nil); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("MigrateGuard(nil pool) = %v, want ErrNilClient", err)
	}
	var nilCtx context.Context
	if err := pglock.MigrateGuard(nilCtx, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("MigrateGuard(nil ctx) = %v, want ErrInvalidOption", err)
	}

	pg, pool := guardServer(t)
	ctx = dlocktest.Context(t)
	g := pglock.NewGuard(pool)
	badTables := []string{"", "Fences", "1abc", "a.b.c", "a-b", "a b", `a"b`, ".a", "a.", "ü", "f;drop table x",
		strings.Repeat("a", 57), strings.Repeat("s", 64) + ".t"}
	tx := guardBegin(t, pool) // the calls fail before using it
	for _, name := range badTables {
		bad := pglock.NewGuard(pool, pglock.WithGuardTable(name))
		for call, err := range calls(bad, tx) {
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("table %q: %s = %v, want ErrInvalidOption", name, call, err)
			}
		}
		if err := pglock.MigrateGuard(ctx, pool, pglock.WithGuardTable(name)); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("MigrateGuard with table %q = %v, want ErrInvalidOption", name, err)
		}
	}

	// A nil tx or fn, an owner text cannot hold.
	if err := g.Check(ctx, nil, "r", f); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Check(nil tx) = %v, want ErrInvalidOption", err)
	}
	if err := g.Do(ctx, "r", f, nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Do(nil fn) = %v, want ErrInvalidOption", err)
	}
	for _, owner := range []string{"a\x00b", "a\xffb"} {
		bad := dlock.Fence{Token: 9, Owner: owner}
		if err := g.Put(ctx, "r", bad, "n", "v"); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Put with owner %q = %v, want ErrInvalidOption", owner, err)
		}
		if err := g.Check(ctx, tx, "r", bad); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Check with owner %q = %v, want ErrInvalidOption", owner, err)
		}
	}
	// Argument checks come first (guard.Checker.Validate).
	if err := g.Check(ctx, nil, "", f); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Check(empty resource) = %v, want ErrInvalidKey", err)
	}
	if err := g.Check(nilCtx, nil, "r", f); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Check(nil ctx) = %v, want ErrInvalidOption", err)
	}
	if err := pglock.NewGuard(nil).Check(ctx, nil, "\xff", f); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Check(invalid resource) on a nil pool = %v, want ErrInvalidKey first", err)
	}
	if hi, err := g.Highest(ctx, "r"); err != nil || hi != (dlock.Fence{}) {
		t.Fatalf("bad calls recorded %+v, %v", hi, err)
	}

	// Tables missing (no MigrateGuard): an error naming MigrateGuard.
	unmigrated := pg.name + "_unmigrated"
	if _, err := pg.Exec("", "CREATE DATABASE "+unmigrated); err != nil {
		t.Fatal(err)
	}
	fresh := pglock.NewGuard(guardPool(t, pg.DSN(unmigrated)))
	for call, err := range calls(fresh, guardBegin(t, guardPool(t, pg.DSN(unmigrated)))) {
		var pgErr *pgconn.PgError
		if call == "Do" {
			continue // fn's "fn ran" would say nothing; checked below
		}
		if err == nil || !strings.Contains(err.Error(), "pglock.MigrateGuard") || !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("without MigrateGuard: %s = %v, want an error naming pglock.MigrateGuard wrapping the server's 42P01", call, err)
		}
	}
	if err := fresh.Do(ctx, "r", f, fn); err == nil || !strings.Contains(err.Error(), "pglock.MigrateGuard") {
		t.Errorf("without MigrateGuard: Do = %v, want an error naming pglock.MigrateGuard", err)
	}

	// A table that is not the guard's.
	guardExec(t, pool, `CREATE TABLE junk (resource text, x int)`)
	if err := pglock.MigrateGuard(ctx, pool, pglock.WithGuardTable("junk")); err == nil || !strings.Contains(err.Error(), "not a table pglock.MigrateGuard made") {
		t.Errorf("MigrateGuard over another table = %v", err)
	}
	guardExec(t, pool, `CREATE TABLE junk2 (resource text, token bigint, owner text); CREATE TABLE junk2_values (resource text, name text, value bytea)`)
	if err := pglock.MigrateGuard(ctx, pool, pglock.WithGuardTable("junk2")); err == nil || !strings.Contains(err.Error(), "not a table pglock.MigrateGuard made") {
		t.Errorf("MigrateGuard over a table with a bigint token = %v", err)
	}
}

// Check on a nil transaction of a concrete type in the pgx.Tx interface
// (a *pgxpool.Tx left nil by a failed Begin) returns an error wrapping
// dlock.ErrInvalidOption.
// Symptom: Guard.Check passed its nil check and panicked with a nil pointer dereference.
func TestGuardCheck_RefusesTypedNilTx(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	g := pglock.NewGuard(newPool(t, pg.DSN("")))
	var tx *pgxpool.Tx
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Guard.Check panicked on a nil *pgxpool.Tx: %v", r)
			}
		}()
		return g.Check(dlocktest.Context(t), tx, "r", dlock.Fence{Token: 1, Owner: "o"})
	}()
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Check(nil *pgxpool.Tx) = %v, want ErrInvalidOption", err)
	}
}

// MigrateGuard is idempotent and can run concurrently; guards on other
// tables (a schema-qualified one, the longest name) are independent.
func TestGuardMigrate(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pool := guardPool(t, pg.DSN(""))
	ctx := dlocktest.Context(t)
	guardExec(t, pool, `CREATE SCHEMA app`)
	long := strings.Repeat("l", 63-len(pglock.GuardValuesSuffix))
	for _, table := range []string{pglock.DefaultGuardTable, "app.fences", long} {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if err := pglock.MigrateGuard(ctx, pool, pglock.WithGuardTable(table)); err != nil {
					t.Errorf("MigrateGuard(%q): %v", table, err)
				}
			})
		}
		wg.Wait()
		if err := pglock.MigrateGuard(ctx, pool, pglock.WithGuardTable(table)); err != nil {
			t.Fatalf("MigrateGuard(%q) again: %v", table, err)
		}
	}
	for i, table := range []string{pglock.DefaultGuardTable, "app.fences", long} {
		g := pglock.NewGuard(pool, pglock.WithGuardTable(table))
		f := dlock.Fence{Token: uint64(10 - i), Owner: "o"}
		if err := g.Put(ctx, "shared-name", f, "n", table); err != nil {
			t.Fatalf("table %q: %v", table, err)
		}
	}
	for i, table := range []string{pglock.DefaultGuardTable, "app.fences", long} {
		g := pglock.NewGuard(pool, pglock.WithGuardTable(table))
		f := dlock.Fence{Token: uint64(10 - i), Owner: "o"}
		if v, ok, err := g.Get(ctx, "shared-name", f, "n"); err != nil || !ok || v != table {
			t.Fatalf("table %q: Get = %q, %v, %v", table, v, ok, err)
		}
	}
	out, err := pg.Exec("", `SELECT count(*) FROM app.fences_values`)
	if err != nil || out != "1" {
		t.Fatalf("app.fences_values rows: %q, %v", out, err)
	}
}

// A read-only transaction, or a server that only allows them (as a
// replica does), cannot check fences: a clear error. Highest still works.
func TestGuardReadOnly(t *testing.T) {
	t.Parallel()
	pg, pool := guardServer(t)
	ctx := dlocktest.Context(t)
	f := dlock.Fence{Token: 3, Owner: "o"}
	g := pglock.NewGuard(pool)
	if err := g.Put(ctx, "existing", f, "n", "v"); err != nil {
		t.Fatal(err)
	}
	wantReadOnly := func(what string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "read-write transaction on the primary") ||
			!errors.As(err, &pgErr) || pgErr.Code != "25006" {
			t.Errorf("%s = %v, want an error wrapping dlock.ErrUnsupported about a read-only transaction", what, err)
		}
	}
	for _, res := range []string{"existing", "fresh"} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		wantReadOnly("Check in a read-only transaction on "+res, g.Check(ctx, tx, res, f))
		_ = tx.Rollback(ctx)
	}
	ro := pglock.NewGuard(guardPool(t, pg.DSN(""), "default_transaction_read_only", "on"))
	wantReadOnly("Put on a read-only server", ro.Put(ctx, "existing", f, "n", "v"))
	_, _, err := ro.Get(ctx, "fresh", f, "n")
	wantReadOnly("Get on a read-only server", err)
	if hi, err := ro.Highest(ctx, "existing"); err != nil || hi != f {
		t.Fatalf("Highest on a read-only server = %+v, %v", hi, err)
	}
}

// A hung server: every call returns by its context's deadline with
// dlock.ErrUnavailable; once the server is back, the guard works.
// testserver.Postgres.Pause stops the postmaster only (each backend is a
// session of its own, out of the postmaster's process group): new
// connections hang, and the backend of an open transaction is stopped
// here by its pid.
func TestGuardUnavailable(t *testing.T) {
	t.Parallel()
	pg, pool := guardServerOn(t, ownPG(t))
	g := pglock.NewGuard(pool)
	ctx := dlocktest.Context(t)
	f := dlock.Fence{Token: 3, Owner: "o"}
	if err := g.Put(ctx, "r", f, "n", "v"); err != nil {
		t.Fatal(err)
	}
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a hung server = %v, want ErrUnavailable and DeadlineExceeded", what, err)
		}
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 200*time.Millisecond) }

	// Check in a transaction whose backend hangs.
	tx := guardBegin(t, pool)
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			stopped = false
		}
	}
	t.Cleanup(cont) // before the server stops
	c, cancel := short()
	want("Check", g.Check(c, tx, "r", f))
	cancel()
	cont()

	// Put, Get and Highest on a new pool while the server accepts no
	// connection.
	hung := pglock.NewGuard(guardPool(t, pg.DSN("")))
	pg.Pause()
	paused := true
	t.Cleanup(func() {
		if paused {
			pg.Resume()
		}
	})
	c, cancel = short()
	want("Put", hung.Put(c, "r", f, "n", "v"))
	cancel()
	c, cancel = short()
	_, _, err := hung.Get(c, "r", f, "n")
	want("Get", err)
	cancel()
	c, cancel = short()
	_, err = hung.Highest(c, "r")
	want("Highest", err)
	cancel()
	pg.Resume()
	paused = false
	for _, g := range []*pglock.Guard{g, hung} {
		if v, ok, err := g.Get(ctx, "r", f, "n"); err != nil || !ok || v != "v" {
			t.Fatalf("Get after the server came back = %q, %v, %v", v, ok, err)
		}
	}
}
