package pglock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A waiter behind PgBouncer in transaction mode does not LISTEN: the
// LISTEN stayed on a pooled server session, every release's NOTIFY then
// reached a session no client was linked to (PgBouncer logged "got packet
// 'A' from server when not linked" for each) and PgBouncer once exited
// with "server in bad state" (found by the safety harness). Direct and
// through a plain TCP proxy, LISTEN is kept.
func TestNoListenThroughPooler(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	bouncer := bouncerFor(t, pg)
	proxy := testserver.StartProxy(t, pg.Addr())
	for _, tc := range []struct {
		name   string
		dsn    string
		pooled bool
	}{
		{"direct", pg.DSN(""), false},
		{"tcp proxy", pg.ViaProxy(proxy.Addr()), false},
		{"pgbouncer", bouncer.DSN(""), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := dlocktest.Context(t)
			holder := pglock.New(newPool(t, tc.dsn))
			waiter := pglock.New(newPool(t, tc.dsn))
			key := dlocktest.Key(t)
			for round := 0; round < 5; round++ {
				lk, err := holder.Acquire(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
				time.Sleep(100 * time.Millisecond) // the waiter subscribes
				if err := lk.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("round %d: waiter: %v", round, err)
				}
			}
			if got := pglock.ListensThroughPooler(waiter); got != tc.pooled {
				t.Errorf("pooler detected = %v, want %v", got, tc.pooled)
			}
		})
	}
	log, _ := os.ReadFile(bouncer.LogPath())
	if n := strings.Count(string(log), "when not linked"); n > 0 {
		t.Errorf("pgbouncer logged %d notifications for server sessions no client was linked to", n)
	}
}

// PostgreSQL stops behind PgBouncer: PgBouncer, still up, turns the
// statements away with a connection exception (SQLSTATE 08P01, "server
// login has been failing"). Symptom guarded against: a Release, or a
// TryAcquire, failing with that bare error rather than ErrUnavailable.
func TestRelease_Unavailable_PostgresDownBehindPgBouncer(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	l := pglock.New(newPool(t, pb.DSN("")))
	// PgBouncer stops before the pool closes (cleanups run last first):
	// with PostgreSQL down it keeps a closed client connection open, and
	// pgx's Close waits 15 s for each.
	t.Cleanup(pb.Stop)
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	// The first statement makes PgBouncer find PostgreSQL down; it may
	// hold it until the context ends, an outage either way.
	for _, what := range []string{"first TryAcquire", "TryAcquire"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := l.TryAcquire(ctx, dlocktest.Key(t))
		cancel()
		t.Logf("%s with PostgreSQL down: %v", what, err)
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("%s with PostgreSQL down behind PgBouncer: %v, want ErrUnavailable", what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = lk.Release(ctx)
	t.Logf("Release with PostgreSQL down: %v", err)
	var pe *pgconn.PgError
	if !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Release with PostgreSQL down behind PgBouncer: %v, want ErrUnavailable", err)
	}
	if errors.As(err, &pe) && !strings.HasPrefix(pe.Code, "08") {
		t.Fatalf("Release: PgBouncer's error %v is not a connection exception", pe)
	}
}

// Every call on a lock held through a PgBouncer that stops answering
// returns by its context's deadline wrapping dlock.ErrUnavailable and the
// deadline. Symptom: Refresh returned a bare deadline error.
func TestLockCalls_UnavailableByDeadline_PgBouncerStalled(t *testing.T) {
	t.Parallel()
	pb := bouncerFor(t, sharedPG(t))
	p := testserver.StartProxy(t, pb.Addr())
	l := pglock.New(newPool(t, strings.Replace(pb.DSN(""), pb.Addr(), p.Addr(), 1)))
	lk, err := l.Acquire(dlocktest.Context(t), dlocktest.Key(t), dlock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p.Stall()
	for _, c := range []struct {
		what string
		fn   func(context.Context) error
	}{{"Refresh", lk.Refresh}, {"Release", lk.Release}} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.fn(ctx)
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s through a stalled PgBouncer = %v, want ErrUnavailable and DeadlineExceeded", c.what, err)
		}
	}
	p.Heal()
}
