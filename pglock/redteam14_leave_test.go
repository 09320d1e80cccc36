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

// A waiting writer's registration statement abandoned on a stalled link
// (its attempt's context ended) reaches PostgreSQL after the writer left
// (the engine's Leave, on another connection, landed first). It must not
// register the writer again: it did, and the writer that had given up kept
// every reader out for the registration's full TTL after the link healed.
func TestRedTeam14_LeaveBeforeLateRegistration(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	faulty := pglock.New(newPool(t, pg.ViaProxy(proxy.Addr())), pglock.WithoutListen())
	healthy := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	key := dlocktest.Key(t)
	warm := mustLock(t, faulty, dlocktest.Key(t), dlock.WithTTL(time.Minute))
	mustRelease(t, warm)
	req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Waiter: dlock.NewOwner()}
	pglock.Register(ctx, healthy, req) // the writer waits
	proxy.Stall()
	rctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	pglock.Register(rctx, faulty, req) // its renewal, held by the link
	cancel()
	if err := pglock.Leave(ctx, healthy, key, req.Waiter); err != nil { // it gives up
		t.Fatal(err)
	}
	proxy.Heal()
	time.Sleep(500 * time.Millisecond) // the held statement is delivered
	r, err := healthy.TryAcquire(ctx, key, dlock.WithShared())
	if err != nil {
		t.Fatalf("reader after the writer left: %v (its late registration keeps readers out)", err)
	}
	mustRelease(t, r)
}
