package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/pglock"
)

// These examples need a PostgreSQL server, so they are compiled but not
// run.

func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l := pglock.New(pool) // creates dlock_leases on first use

	lk, err := l.TryAcquire(ctx, "nightly-report", dlock.WithTTL(time.Minute))
	var na *dlock.NotAcquiredError
	switch {
	case errors.As(err, &na):
		fmt.Println("already running:", na.Holders[0])
		return
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Release(ctx)
	fmt.Println("holding with fencing token", lk.Token())
}

// Behind PgBouncer in transaction pooling mode: pglock keeps no session
// state; pgx must not cache prepared statements either.
func ExampleNew_pgbouncer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@pgbouncer:6432/app?default_query_exec_mode=exec")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglock.Migrate(ctx, pool, pglock.WithTable("app.locks")); err != nil {
		log.Fatal(err)
	}
	l := pglock.New(pool, pglock.WithTable("app.locks"), pglock.WithoutMigrate())
	_ = l
}
