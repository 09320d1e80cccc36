package pglock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// On a long schema-qualified table name that WithTable accepts (two parts
// of up to 48 bytes, a channel name over PostgreSQL's 63 bytes), Release
// succeeds and its NOTIFY wakes a waiter.
// Symptom: every Release failed with "channel name too long", and waiters' truncated LISTEN never matched.
func TestRelease_WakesWaitersOnLongSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
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
	got := acquireLater(dlocktest.Context(t), waiter, key, time.Minute)
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

// A break while the Locker's LISTEN connection is down (its notice sent
// to nobody) reaches the holder once the connection is opened again, not
// at the holder's next renewal.
// Symptom: a holder broken while its LISTEN connection reconnected learned of it only at its next renewal.
func TestBind_BreakWhileListenDownFoundOnReconnect(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	operator := pglock.New(newPool(t, pg.DSN("")), pglock.WithoutListen())
	key := dlocktest.Key(t)
	const ttl = time.Minute // first renewal point 20s on: far past a reconnect
	lk, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	// The lock listens (its Locker's LISTEN connection is open) once held
	// past 100ms; cut that connection, then break the lock.
	waitListens(t, pg, 1)
	if _, err := pg.Exec("", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()"); err != nil {
		t.Fatal(err)
	}
	b, err := dlock.Break(dlocktest.Context(t), operator, key, "")
	if err != nil || len(b.Holders) != 1 {
		t.Fatalf("Break: %+v, %v", b, err)
	}
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	select {
	case <-lk.Lost():
	case <-timer.C:
		t.Fatal("Lost() still open at the first renewal point: the break did not reach the holder")
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossBackend || !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Errorf("Err() = %v, want a *LostError with reason %q wrapping ErrNotHeld", lk.Err(), dlock.LossBackend)
	}
}

// A check of the held locks that fails (here, the pool has no free
// connection within the request timeout) is run again after a pause,
// so a break is still found before the holder's next renewal.
// Symptom: a failed check was retried only at the next break notice, and the break found at the renewal.
func TestBind_FailedCheckIsRetried(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pool := newPool(t, pg.DSN("")+"&pool_max_conns=1")
	// The table is created first, without the short timeout: a fresh
	// server's DDL may take longer than the holder's requests.
	if err := pglock.Migrate(dlocktest.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	holder := pglock.New(pool, pglock.WithRequestTimeout(2*time.Second), pglock.WithoutMigrate())
	operator := pglock.New(newPool(t, pg.DSN("")), pglock.WithoutListen())
	key := dlocktest.Key(t)
	const ttl = time.Minute // first renewal point 20s on
	lk, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(dlocktest.Context(t))
	waitListens(t, pg, 1)
	// Take the pool's only connection: the check the break triggers
	// fails, waiting for one.
	c, err := pool.Acquire(dlocktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	held := true
	defer func() {
		if held {
			c.Release()
		}
	}()
	failed := make(chan struct{}, 16)
	pglock.SetHeldRoundHook(t, holder, func(ok bool) {
		if !ok {
			failed <- struct{}{}
		}
	})
	if b, err := dlock.Break(dlocktest.Context(t), operator, key, ""); err != nil || len(b.Holders) != 1 {
		t.Fatalf("Break: %+v, %v", b, err)
	}
	// Two failed rounds once the break is done: the second is a retry (a
	// round that began before the break may be the first).
	for range 2 {
		select {
		case <-failed:
		case <-lk.Lost():
			t.Fatalf("lost while no check could run: %v", lk.Err())
		case <-time.After(dlocktest.HangTimeout):
			t.Fatal("hang: no failed check to retry")
		}
	}
	c.Release()
	held = false
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	select {
	case <-lk.Lost():
	case <-timer.C:
		t.Fatal("Lost() still open at the first renewal point: the failed check was not run again")
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossBackend {
		t.Errorf("Err() = %v, want a *LostError with reason %q", lk.Err(), dlock.LossBackend)
	}
}
