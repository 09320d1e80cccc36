package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// Expiry is judged by the database's clock alone: no client timestamp is
// ever written or compared. The test moves a lease's expiry as the
// database sees it (the same as the database's clock moving against the
// clients') and checks that contenders follow the database, not the
// holder's or their own clock: a lease the database has passed is taken
// over although its holder's local deadline is an hour away, and a lease
// in the database's future is not, however long ago its TTL ran out on
// the contender's clock.
func TestExpiryByDatabaseClock(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	a := pglock.New(newPool(t, pg.DSN("")))
	bPool := newPool(t, pg.DSN(""))
	b := pglock.New(bPool)
	key := dlocktest.Key(t)

	lk, err := a.Acquire(ctx, key, dlock.WithTTL(time.Hour), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	// The lease was computed by the server: its expiry is the server's
	// clock plus the TTL.
	left, err := pg.Exec("", "SELECT (extract(epoch FROM expires_at - clock_timestamp()) BETWEEN 3000 AND 3600)::text FROM dlock_leases WHERE key = '"+escape(key)+"'")
	if err != nil || left != "true" {
		t.Fatalf("expires_at - server clock within (50m, 1h]: %q %v", left, err)
	}

	// The database's clock passes the lease: the key is free for b at once,
	// although a's local deadline is an hour away.
	if _, err := pg.Exec("", "UPDATE dlock_leases SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE key = '"+escape(key)+"'"); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, key, dlock.WithTTL(time.Second), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("lease expired by the database's clock not taken over: %v", err)
	}
	if lb.Token() <= lk.Token() {
		t.Errorf("takeover token %d not above %d", lb.Token(), lk.Token())
	}
	if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("old holder's Refresh after the takeover = %v, want ErrLockLost", err)
	}

	// b dies holding the key (its pool is gone, so nothing it does reaches
	// the server), and its lease lies in the database's future: b's 1s TTL
	// has long run out on every client's clock, but not on the database's.
	bPool.Close()
	if _, err := pg.Exec("", "UPDATE dlock_leases SET expires_at = clock_timestamp() + interval '1 hour' WHERE key = '"+escape(key)+"'"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past b's TTL by any client clock
	if _, err := a.TryAcquire(ctx, key, dlock.WithTTL(time.Second)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Errorf("lease live by the database's clock taken: %v", err)
	}
}
