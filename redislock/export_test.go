package redislock

import (
	"context"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// BreakListening reports whether l has heard a break notice (its pattern
// subscription's confirmation counts as one: on a healthy link, the
// subscription is up) and no read of a held lock's key, which a notice
// starts, is queued or running (tests: nothing of the break listening is
// in flight). It reads both under the watch's lock, as notices update
// them.
func BreakListening(l *Locker) bool {
	bw, bc := &l.b.breaks, &l.b.breakChecks
	bw.mu.Lock()
	defer bw.mu.Unlock()
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return bw.gen.Load() > 0 && !bc.running && len(bc.pending) == 0
}

// SetOfferHook makes hook run before each question whether the server
// offers CAS and CAD (nil: none), until the test ends.
func SetOfferHook(t interface{ Cleanup(func()) }, hook func()) {
	offerHook.Store(&hook)
	t.Cleanup(func() { offerHook.Store(nil) })
}

// AbortShared undoes a shared request of key on l as the core does when
// the request's outcome is unknown (driver.Aborter), and returns when it
// is done.
func AbortShared(ctx context.Context, l *Locker, key string) error {
	return l.b.Abort(ctx, &driver.Request{Key: key, Owner: dlock.NewOwner(), Mode: driver.Shared})
}
