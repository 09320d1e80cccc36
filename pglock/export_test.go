package pglock

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/driver"
)

// ListensThroughPooler reports whether l found a pooler between it and
// PostgreSQL and stopped LISTENing (tests).
func ListensThroughPooler(l *Locker) bool { return l.b.l != nil && l.b.l.gaveUp() == errPooled }

// ListenGivenUp is why l tries LISTEN no more; nil if it still does
// (tests).
func ListenGivenUp(l *Locker) error { return l.b.l.gaveUp() }

// SetListenLinger sets how long l's LISTEN connection outlives its last
// waiter (tests).
func SetListenLinger(l *Locker, d time.Duration) {
	l.b.l.mu.Lock()
	l.b.l.linger = d
	l.b.l.mu.Unlock()
}

// TryRaw makes one attempt through l's driver, as the engine would, for
// tests that need a fixed owner or waiter (a retried attempt, a waiting
// writer that dies). The grant's lease is released by release.
func TryRaw(ctx context.Context, l *Locker, req *driver.Request) (token uint64, release func(context.Context) error, err error) {
	g, err := l.b.Try(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	return g.Token, g.Lease.Release, nil
}

// Leave withdraws waiter's registration as a waiting writer of key.
func Leave(ctx context.Context, l *Locker, key, waiter string) error {
	return l.b.Leave(ctx, key, waiter)
}

// Abort undoes req as the engine does after an attempt whose outcome is
// unknown.
func Abort(ctx context.Context, l *Locker, req *driver.Request) error {
	return l.b.Abort(ctx, req)
}

// Register records req's Acquire as a waiting writer of req.Key, as a
// refused attempt does (tests).
func Register(ctx context.Context, l *Locker, req *driver.Request) {
	l.b.register(ctx, req)
}

// SetHeldRoundHook makes f run after each round of l's held locks' watch
// that had leases to check, with whether its statement succeeded, until
// the test ends.
func SetHeldRoundHook(t interface{ Cleanup(func()) }, l *Locker, f func(ok bool)) {
	l.b.held.hook.Store(&f)
	t.Cleanup(func() { l.b.held.hook.Store(nil) })
}

// CheckStatementMode runs l's check of its pool now (as its first
// statements start it in the background) and returns the mode its
// statements use from then on (tests).
func CheckStatementMode(l *Locker) pgx.QueryExecMode {
	for !l.b.stmt.checking.CompareAndSwap(false, true) {
		time.Sleep(time.Millisecond) // a check of its own runs: it ends within the request timeout
	}
	l.b.stmt.check()
	return l.b.stmt.get()
}

// Wakes is the number of waits l's LISTEN connection woke by a notice
// (tests: a release wakes one waiting writer).
func Wakes(l *Locker) int64 { return l.b.l.wakes.Load() }

// TaggedWaiters is the number of l's waits on key that a release can
// wake by name (their registration as a waiting writer is tied to their
// subscription) (tests).
func TaggedWaiters(l *Locker, key string) int {
	l.b.l.mu.Lock()
	defer l.b.l.mu.Unlock()
	n := 0
	for s := range l.b.l.subs[key] {
		if s.waiter != "" {
			n++
		}
	}
	return n
}

// Listening reports whether l's LISTEN connection is listening (tests).
func Listening(l *Locker) bool { return l.b.l.listening.Load() }
