package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/pglock"
)

// The guard examples talk to a PostgreSQL server at localhost:5432, so
// they are compiled but not run.

func newGuardPool(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	return pool
}

// takeOne takes one item of sku out of stock for the holder of the lock
// lk, fenced in the same transaction as the UPDATE: if a newer holder of
// the lock has checked in meanwhile (lk's holder paused past its lease),
// Check refuses the fence and the UPDATE never commits.
func takeOne(ctx context.Context, pool *pgxpool.Pool, g *pglock.Guard, lk *dlock.Lock, sku string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	// Check first: it waits for an older holder's transaction to end, and
	// once it returns, no older holder can commit.
	if err := g.Check(ctx, tx, "sku:"+sku, lk.Fence()); err != nil {
		return err // *dlock.StaleTokenError: a newer holder came first
	}
	var qty int
	if err := tx.QueryRow(ctx, `SELECT qty FROM inventory WHERE sku = $1`, sku).Scan(&qty); err != nil {
		return err
	}
	if qty == 0 {
		return errors.New("out of stock")
	}
	if _, err := tx.Exec(ctx, `UPDATE inventory SET qty = qty - 1 WHERE sku = $1`, sku); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// An inventory decrement fenced inside its transaction, under a pglock
// lock on the same database (any dlock Locker the processes share works).
func ExampleGuard_Check() {
	ctx := context.Background()
	pool := newGuardPool(ctx)
	defer pool.Close()
	// Once, at deployment or start-up: creates dlock_fences and
	// dlock_fences_values if missing.
	if err := pglock.MigrateGuard(ctx, pool); err != nil {
		log.Fatal(err)
	}
	g := pglock.NewGuard(pool)
	var locker dlock.Locker = pglock.New(pool)
	err := dlock.Do(ctx, locker, "sku:42", func(ctx context.Context, lk *dlock.Lock) error {
		return takeOne(ctx, pool, g, lk, "42")
	})
	if errors.Is(err, dlock.ErrStaleToken) {
		log.Print("a newer lock holder took over: nothing written")
	} else if err != nil {
		log.Fatal(err)
	}
}

// Do is the same fenced transaction in one call: fn runs after the check,
// in the transaction, which Do commits (or rolls back if fn fails).
func ExampleGuard_Do() {
	ctx := context.Background()
	pool := newGuardPool(ctx)
	defer pool.Close()
	g := pglock.NewGuard(pool, pglock.WithGuardTable("app.fences"))
	f := dlock.Fence{Token: 42, Owner: "worker-b"} // in a real program, Lock.Fence()
	err := g.Do(ctx, "sku:42", f, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE inventory SET qty = qty - 1 WHERE sku = '42' AND qty > 0`)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A fenced read: Check, then the SELECT, in one committed transaction.
// With an exclusive fence the check is recorded, so an older holder can
// no longer write what was read.
func ExampleGuard_Check_fencedRead() {
	ctx := context.Background()
	pool := newGuardPool(ctx)
	defer pool.Close()
	g := pglock.NewGuard(pool)
	f := dlock.Fence{Token: 43, Owner: "worker-c"} // in a real program, Lock.Fence()
	var qty int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := g.Check(ctx, tx, "sku:42", f); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT qty FROM inventory WHERE sku = '42'`).Scan(&qty)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("in stock:", qty)
}
