package pglock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// harness is the conformance harness on the server at dsn; admin deletes
// rows behind their holders' backs. Its short lease is 2s rather than the
// suite's 500ms: on a loaded 2-core machine running the race detector a
// renewal's round trip can exceed the third of a 500ms lease, and a
// renewed lock is then rightly reported lost; the suite's promises do not
// depend on the TTL, only on renewals fitting in it.
func harness(t *testing.T, pg *pgDB, dsn string) dlocktest.Harness {
	return dlocktest.Harness{
		TTL: 2 * time.Second,
		New: func(t testing.TB) dlock.Locker { return pglock.New(newPool(t, dsn)) },
		Expire: func(t testing.TB, key string) {
			k := "'" + escape(key) + "'"
			if _, err := pg.Exec("", "DELETE FROM dlock_leases WHERE key = "+k+"; DELETE FROM dlock_leases_holders WHERE key = "+k); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// withFaults adds the fault section: Faults.New reaches the server
// through a fault proxy, Pause stops postgres and all its backends.
func withFaults(h dlocktest.Harness, pg *pgDB, dsnVia func(addr string) string) dlocktest.Harness {
	h.Faults = &dlocktest.Faults{
		New: func(t testing.TB) (dlock.Locker, dlocktest.Link) {
			p := testserver.StartProxy(t, pg.Addr())
			return settled(pglock.New(newPool(t, dsnVia(p.Addr())))), p
		},
		Down: func(t testing.TB) (dlock.Locker, func()) {
			p := testserver.StartProxy(t, pg.Addr())
			return settled(pglock.New(newPool(t, dsnVia(p.Addr())))), p.Stop
		},
		Pause: func(t testing.TB, keys ...string) func() {
			pg.Pause()
			return pg.Resume
		},
	}
	return h
}

// settled runs l's pool check now, so that no check of its own runs
// through the fault proxy while a test has a fault armed.
func settled(l *pglock.Locker) *pglock.Locker {
	pglock.CheckStatementMode(l)
	return l
}

// proxiedBouncer is the fault section's New and Down for PgBouncer pb:
// a pool whose every connection to PgBouncer goes through a fault proxy.
func proxiedBouncer(pb *bouncerDB) *dlocktest.Faults {
	via := func(t testing.TB) (dlock.Locker, *testserver.Proxy) {
		p := testserver.StartProxy(t, pb.Addr())
		return settled(pglock.New(newPool(t, strings.Replace(pb.DSN(""), pb.Addr(), p.Addr(), 1)))), p
	}
	return &dlocktest.Faults{
		New: func(t testing.TB) (dlock.Locker, dlocktest.Link) { return via(t) },
		Down: func(t testing.TB) (dlock.Locker, func()) {
			l, p := via(t)
			return l, p.Stop
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	h := harness(t, pg, pg.DSN(""))
	h.TellsBroken = true // a break's NOTIFY reaches the holder's LISTEN
	h = withFaults(h, pg, func(addr string) string {
		return "postgres://" + testserver.PostgresUser + "@" + addr + "/postgres?sslmode=disable"
	})
	dlocktest.TestLocker(t, h)
}

// Through PgBouncer in transaction pooling mode: no session state may be
// relied on between statements.
func TestConformancePgBouncer(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	pb := bouncerFor(t, pg)
	h := harness(t, pg, pb.DSN(""))
	dlocktest.TestLocker(t, h)
	// The fault section runs on the server direct (TestConformance);
	// PgBouncer refusing or resetting connections is an outage too.
	h.Faults = proxiedBouncer(pb)
	t.Run("Unreachable", func(t *testing.T) { dlocktest.TestUnreachable(t, h) })
}
