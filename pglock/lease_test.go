package pglock_test

import (
	"errors"
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
	listens := "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = current_database()"
	for end := time.Now().Add(dlocktest.HangTimeout); ; time.Sleep(10 * time.Millisecond) {
		out, err := pg.Exec("", listens)
		if err != nil {
			t.Fatal(err)
		}
		if out == "1" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("hang: %s LISTEN connections, want the holder's", out)
		}
	}
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
