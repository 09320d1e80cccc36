package pglock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/background"
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
	t.Parallel()
	pg := ownPG(t)
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
	got := acquireLater(ctx, waiter, key, time.Minute)
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

// A role that may not run pg_backend_pid() (revoked from PUBLIC in a
// hardened database): the pooler check failed on every LISTEN attempt, so
// while anyone waited the Locker opened a new server connection a second
// and closed it, never listening. A server that answers the check with an
// error is now taken as "cannot tell": the Locker stops trying LISTEN and
// its waiters poll, still acquiring the key once it is released.
func TestRedTeam_PIDCheckRefused(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'pw'",
		"GRANT SELECT, INSERT, UPDATE ON " + pglock.DefaultTable + " TO app",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + pglock.DefaultTable + "_holders, " + pglock.DefaultTable + "_writers TO app",
		"GRANT USAGE ON SEQUENCE " + pglock.DefaultTable + "_token_seq TO app",
		"GRANT SELECT ON " + pglock.MigrationsTable + " TO app",
		"REVOKE EXECUTE ON FUNCTION pg_backend_pid() FROM PUBLIC",
	} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	app := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app:pw@", 1)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, app))
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
	end := time.Now().Add(dlocktest.HangTimeout)
	for pglock.ListenGivenUp(waiter) == nil {
		if time.Now().After(end) {
			t.Fatal("the Locker still tries to LISTEN (a new server connection a second) though the server refuses the pooler check")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("given up: %v", pglock.ListenGivenUp(waiter))
	if pglock.ListensThroughPooler(waiter) {
		t.Error("reported as a pooler")
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// A pool whose AfterConnect sets something up per connection and whose
// BeforeClose tears it down (a registry of connections, say): the LISTEN
// connection, dialed with the pool's AfterConnect, was closed without its
// BeforeClose, so each LISTEN connection left an entry behind.
//
// Not parallel: it waits for all of dlock's background work, which is
// process-wide, to end.
func TestRedTeam_ListenConnBeforeClose(t *testing.T) {
	pg := ownPG(t)
	cfg, err := pgxpool.ParseConfig(pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	open := map[*pgx.Conn]bool{}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		mu.Lock()
		open[c] = true
		mu.Unlock()
		return nil
	}
	cfg.BeforeClose = func(c *pgx.Conn) {
		mu.Lock()
		delete(open, c)
		mu.Unlock()
	}
	wpool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(wpool)
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
	waitListening(t, pg)
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wpool.Close()
	if !background.Wait(dlocktest.HangTimeout) {
		t.Fatal("the LISTEN loop still runs")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(open) != 0 {
		t.Errorf("%d connections set up by AfterConnect were closed without BeforeClose", len(open))
	}
}
