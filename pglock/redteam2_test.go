package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A pool whose connections have their own notification handler
// (ConnConfig.OnNotification, e.g. an application that LISTENs on its own
// pool connections): pgx then buffers no notification, so
// WaitForNotification on the LISTEN connection, dialed with the pool's
// configuration, returned a nil notification with no error, and the
// LISTEN loop dereferenced it: a nil pointer panic in a background
// goroutine on the first release, which killed the process.
func TestRedTeam_PoolOnNotificationHandler(t *testing.T) {
	pg := testserver.StartPostgres(t)
	cfg, err := pgxpool.ParseConfig(pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) {}
	wpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(wpool)
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lk, err := waiter.Acquire(ctx, key, dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Minute}))
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	waitListening(t, pg)
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("the waiter was not woken by the release")
	}
}
