package bench

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// pgPool is a pgxpool with its defaults on srv, closed when b ends.
func pgPool(b *testing.B, srv *testserver.Postgres) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), srv.DSN(""))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// pgWAL is the server's current write-ahead log position, in bytes.
func pgWAL(b *testing.B, p *pgxpool.Pool) int64 {
	var n int64
	if err := p.QueryRow(context.Background(), "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// pgOp is one uncontended acquire+release on key.
type pgOp func(ctx context.Context, key string) error

// benchPG measures op on key() and reports the write-ahead log the server
// wrote per operation (walB/op: what it costs the server to make it
// durable; a read-only operation writes none).
func benchPG(b *testing.B, p *pgxpool.Pool, key func() string, op pgOp) {
	ctx := context.Background()
	before := pgWAL(b, p)
	n := 0
	b.ResetTimer()
	for b.Loop() {
		if err := op(ctx, key()); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.StopTimer()
	b.ReportMetric(float64(pgWAL(b, p)-before)/float64(n), "walB/op")
}

// BenchmarkPostgres is dlock's pglock against the advisory locks a Go
// program takes without a lock library, on one PostgreSQL server and
// default pgxpools, uncontended acquire+release from one goroutine:
//
//   - pglock: Acquire and Release, one statement each, each its own
//     transaction writing the key's row (a lease by the database's clock
//     and a fencing token), no session state.
//   - advisory-session: pg_try_advisory_lock(hashtext(key)) and
//     pg_advisory_unlock on a pooled connection kept while the lock is
//     held: two round trips, nothing written, no lease, no token.
//   - advisory-xact: BEGIN, pg_try_advisory_xact_lock(hashtext(key)),
//     COMMIT: three round trips, nothing written, no lease, no token.
//
// distinct-keys takes a new key each time (as the other backends'
// benches: pglock inserts the key's row); one-key the same key again and
// again (pglock takes over its released row). rtt is SELECT 1, one round
// trip of the pool. The advisory locks are expected to be faster: they
// give much less (see pglock's package doc).
func BenchmarkPostgres(b *testing.B) {
	srv := testserver.StartPostgres(b)
	dpool, ppool := pgPool(b, srv), pgPool(b, srv)
	l := pglock.New(dpool)
	pglockOp := func(ctx context.Context, key string) error {
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			return err
		}
		return lk.Release(ctx)
	}
	sessionOp := func(ctx context.Context, key string) error {
		c, err := ppool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		var ok bool
		if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", key).Scan(&ok); err != nil || !ok {
			return errors.Join(err, errors.New("advisory lock "+key+" not taken"))
		}
		if err := c.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtext($1))", key).Scan(&ok); err != nil || !ok {
			return errors.Join(err, errors.New("advisory lock "+key+" not released"))
		}
		return nil
	}
	xactOp := func(ctx context.Context, key string) error {
		tx, err := ppool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // after Commit: a no-op
		var ok bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(hashtext($1))", key).Scan(&ok); err != nil || !ok {
			return errors.Join(err, errors.New("advisory xact lock "+key+" not taken"))
		}
		return tx.Commit(ctx)
	}
	// Warm both pools (connections, prepared statements, pglock's table)
	// before measuring any.
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		for _, op := range []pgOp{pglockOp, sessionOp, xactOp} {
			if err := op(ctx, benchKey()); err != nil {
				b.Fatal(err)
			}
		}
	}
	one := benchKey()
	same := func() string { return one }
	b.Run("rtt", func(b *testing.B) {
		benchPG(b, ppool, same, func(ctx context.Context, _ string) error {
			_, err := ppool.Exec(ctx, "SELECT 1")
			return err
		})
	})
	for _, keys := range []struct {
		name string
		key  func() string
	}{{"distinct-keys", benchKey}, {"one-key", same}} {
		b.Run(keys.name, func(b *testing.B) {
			b.Run("pglock", func(b *testing.B) { benchPG(b, dpool, keys.key, pglockOp) })
			b.Run("advisory-session", func(b *testing.B) { benchPG(b, ppool, keys.key, sessionOp) })
			b.Run("advisory-xact", func(b *testing.B) { benchPG(b, ppool, keys.key, xactOp) })
		})
	}
}
