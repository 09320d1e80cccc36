package pglock_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

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

// A key whose name begins like a break notice is still a key: its
// waiters are woken by its release, not left to poll.
// Symptom: releases of a key named "dlock-break:…" woke none of its waiters.
func TestWatch_KeyShapedLikeABreakNoticeWakesItsWaiters(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, pg.DSN("")))
	key := "dlock-break:" + dlocktest.Key(t)
	lk, err := holder.Acquire(dlocktest.Context(t), key, dlock.WithTTL(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		// Its polls are an hour apart and its lease check five minutes:
		// only a wake-up gets it the key within the test's context.
		w, err := waiter.Acquire(dlocktest.Context(t), key, dlock.WithBackoff(dlock.ConstBackoff{Delay: time.Hour}))
		if err == nil {
			err = w.Release(dlocktest.Context(t))
		}
		got <- err
	}()
	waitListens(t, pg, 2) // the holder's Locker and the waiter's
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter of a released key: %v", err)
	}
}

// waitListens waits (bounded) until n LISTEN connections are open on
// pg's database.
func waitListens(t *testing.T, pg *pgDB, n int) {
	t.Helper()
	q := "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()"
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		out, err := pg.Exec("", q)
		if err != nil {
			t.Fatal(err)
		}
		if out == strconv.Itoa(n) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %s LISTEN connections, want %d", out, n)
		}
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
