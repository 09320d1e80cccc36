package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// An attempt abandoned on a stalled link is undone by Abort, but the
// attempt's statement is still on its way: held by the network, it reaches
// PostgreSQL after the Abort (here: Abort through a healthy connection
// while the attempt waits in the stalled proxy, which delivers it on
// Heal). The late statement must not grant the aborted owner anything: it
// did, in every mode, and the key (a reader's share, a limit-1 semaphore's
// permit, the exclusive lease) stayed taken, by nobody, for the lease's
// full TTL after the link healed.
func TestRedTeam14_AbortBeforeLateGrant(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	faulty := pglock.New(newPool(t, pg.ViaProxy(proxy.Addr())), pglock.WithoutListen())
	healthy := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	for _, mode := range []driver.Mode{driver.Shared, driver.Limited, driver.Exclusive} {
		key := dlocktest.Key(t)
		warm := mustLock(t, faulty, dlocktest.Key(t), dlock.WithTTL(time.Minute))
		mustRelease(t, warm)
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Mode: mode, Limit: 1}
		proxy.Stall()
		actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, _, err := pglock.TryRaw(actx, faulty, req)
		cancel()
		if err == nil {
			t.Fatalf("%s: granted through a stalled link", mode)
		}
		if err := pglock.Abort(ctx, healthy, req); err != nil {
			t.Fatalf("%s: abort: %v", mode, err)
		}
		proxy.Heal()
		time.Sleep(500 * time.Millisecond) // the held statement is delivered
		n, err := pg.Exec("", "SELECT (SELECT count(*) FROM dlock_leases_holders WHERE key = '"+escape(key)+"' AND NOT released AND expires_at > clock_timestamp()) + (SELECT count(*) FROM dlock_leases WHERE key = '"+escape(key)+"' AND expires_at > clock_timestamp())")
		if err != nil {
			t.Fatal(err)
		}
		if n != "0" {
			t.Errorf("%s: the aborted attempt holds the key (%s live holder rows) after its late statement landed", mode, n)
		}
		w, err := healthy.TryAcquire(ctx, key)
		if err != nil {
			t.Errorf("%s: writer after the aborted attempt: %v", mode, err)
			continue
		}
		mustRelease(t, w)
	}
}
