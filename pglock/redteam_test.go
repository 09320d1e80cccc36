package pglock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A long schema-qualified table name that WithTable accepts (two parts of
// up to 48 bytes) made a NOTIFY channel name over PostgreSQL's 63 bytes:
// every Release failed with "channel name too long", so locks were only
// freed by expiry, and the waiters' LISTEN (truncated by the server) never
// matched.
func TestRedTeam_LongTableNameRelease(t *testing.T) {
	pg := testserver.StartPostgres(t)
	schema, table := strings.Repeat("s", 48), strings.Repeat("t", 48)
	if _, err := pg.Exec("", "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	opts := []pglock.Option{pglock.WithTable(schema + "." + table)}
	key := dlocktest.Key(t)
	holder, err := pglock.New(newPool(t, pg.DSN("")), opts...).Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter whose poll is a minute: only the release's NOTIFY wakes it
	// within the test's bound.
	waiter := pglock.New(newPool(t, pg.DSN("")), opts...)
	got := make(chan error, 1)
	go func() {
		lk, err := waiter.Acquire(dlocktest.Context(t), key, dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Minute}))
		if err == nil {
			err = lk.Release(context.Background())
		}
		got <- err
	}()
	waitListening(t, pg)
	if err := holder.Release(dlocktest.Context(t)); err != nil {
		t.Fatalf("Release with table %s.%s: %v", schema, table, err)
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

// waitListening waits until some connection of pg has run LISTEN, and a
// little more (the waiter's attempt after subscribing).
func waitListening(t *testing.T, pg *testserver.Postgres) {
	t.Helper()
	end := time.Now().Add(dlocktest.HangTimeout)
	for {
		out, err := pg.Exec("", "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'")
		if err != nil {
			t.Fatal(err)
		}
		if out != "0" {
			break
		}
		if time.Now().After(end) {
			t.Fatal("hang: the waiter never listened")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
}
