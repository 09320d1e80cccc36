package pglock_test

import (
	"os"
	"strings"
	"testing"
	"time"

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
