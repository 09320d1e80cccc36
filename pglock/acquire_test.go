package pglock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// An attempt that finds the key held is a read: it does not lock the
// holder's row (the row's xmax stays 0), draws no token (the sequence
// does not move) and reports the holder.
func TestFailedAttemptIsARead(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder, err := pglock.New(newPool(t, pg.DSN(""))).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	query := func(sql string) string {
		t.Helper()
		out, err := pg.Exec("", sql)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	seq := query("SELECT last_value FROM dlock_leases_token_seq")
	other := pglock.New(newPool(t, pg.DSN("")))
	for i := 0; i < 10; i++ {
		_, err := other.TryAcquire(ctx, key)
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) {
			t.Fatalf("attempt %d: %v, want the key held", i, err)
		}
		if len(na.Holders) != 1 || na.Holders[0].Token != holder.Token() {
			t.Fatalf("attempt %d: holders %+v, want the holder with token %d", i, na.Holders, holder.Token())
		}
	}
	if got := query("SELECT last_value FROM dlock_leases_token_seq"); got != seq {
		t.Errorf("the token sequence moved from %s to %s: failed attempts drew tokens", seq, got)
	}
	if got := query("SELECT xmax FROM dlock_leases WHERE key = '" + escape(key) + "'"); got != "0" {
		t.Errorf("the holder's row has xmax %s: a failed attempt locked it", got)
	}
}
