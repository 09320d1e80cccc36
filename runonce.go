package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/background"
)

// RunOnce runs a scheduled job on at most one of the replicas that fire it
// for the same period (ShedLock's model). Every replica's scheduler calls
// RunOnce(ctx, l, "nightly-report", atMostFor, atLeastFor, job) when the
// job is due; the replica that gets key runs fn, the others skip it and
// get (false, nil).
//
//   - atLeastFor: the key stays held at least this long after the acquire
//     request was sent, even if fn takes a millisecond, so that a replica
//     whose clock (or scheduler) is a little late finds it held and skips
//     instead of running the job a second time for the same period.
//     RunOnce returns when fn does; if fn was quicker than atLeastFor, the
//     lock is kept, renewed, until then and released by a timer. If the
//     process dies meanwhile its lease (TTL ≥ atLeastFor) still covers
//     atLeastFor.
//   - atMostFor: the lock is never held longer than this: fn's context is
//     cancelled at atMostFor (dlock.WithMaxHold) or when the lock is lost,
//     and a runner that dies keeps the key for at most its TTL ≤ atMostFor.
//
// The lease TTL is WithTTL's if given (it must lie in [atLeastFor,
// atMostFor]), else DefaultTTL clamped to that range. Other options apply
// as for TryAcquire (a WithMaxHold below atMostFor is kept, and must not
// be below atLeastFor), except WithShared and WithLimit(n > 1), which would
// let several replicas run the job and are an error wrapping
// ErrInvalidOption. RunOnce never waits for the key.
//
// It returns ran = true when fn ran, with fn's error joined with an error
// wrapping ErrLockLost if the lock was lost (or atMostFor reached) while
// fn ran: the run may not have been the only one. ran = false with a nil
// error means another replica holds the key; with an error, that the
// attempt failed (the service is unavailable, bad arguments).
//
// An attempt that failed transiently (dlock.ErrTransient: nothing was
// observed and nothing left behind, such as a quorum not reached in time
// on a fresh connection) is repeated, up to RunOnceAttempts attempts in
// all, after a backoff step (WithBackoff), within ctx.
//
// Bounds: 0 < atMostFor ≤ MaxTTL and 0 ≤ atLeastFor ≤ atMostFor, else an
// error wrapping ErrInvalidOption.
func RunOnce(ctx context.Context, l Locker, key string, atMostFor, atLeastFor time.Duration, fn func(ctx context.Context) error, opts ...Option) (ran bool, err error) {
	switch {
	case l == nil || isNilPointer(l):
		return false, ErrNilClient
	case ctx == nil:
		return false, errNilContext
	case fn == nil:
		return false, fmt.Errorf("%w: nil function", ErrInvalidOption)
	case atMostFor <= 0 || atMostFor > MaxTTL:
		return false, fmt.Errorf("%w: RunOnce atMostFor %v must be in (0, %v]", ErrInvalidOption, atMostFor, MaxTTL)
	case atLeastFor < 0 || atLeastFor > atMostFor:
		return false, fmt.Errorf("%w: RunOnce atLeastFor %v must be in [0, atMostFor %v]", ErrInvalidOption, atLeastFor, atMostFor)
	}
	cfg, err := newConfig(key, 1, opts...) // the backend judges its own minimum TTL
	if err != nil {
		return false, err
	}
	if cfg.mode == Shared || cfg.mode == Limited && cfg.limit > 1 {
		// Every replica would get the key and run the job.
		return false, fmt.Errorf("%w: RunOnce runs the job once: a %s lock (limit %d) would let several replicas run it", ErrInvalidOption, cfg.mode, cfg.limit)
	}
	ttl := min(max(DefaultTTL, atLeastFor), atMostFor)
	if cfg.ttlSet {
		// The TTL is kept in whole milliseconds (newConfig): WithTTL(x)
		// with atLeastFor x fits whatever x's sub-millisecond part.
		if cfg.TTL < atLeastFor.Truncate(time.Millisecond) || cfg.TTL > atMostFor {
			return false, fmt.Errorf("%w: RunOnce TTL %v must be in [atLeastFor %v, atMostFor %v]", ErrInvalidOption, cfg.TTL, atLeastFor, atMostFor)
		}
		ttl = cfg.TTL
	}
	maxHold := atMostFor
	if cfg.MaxHold > 0 && cfg.MaxHold < atMostFor {
		// The caller's own cap applies, as for TryAcquire; it must leave
		// atLeastFor covered (a lock lost at its cap is released at once).
		if cfg.MaxHold < atLeastFor {
			return false, fmt.Errorf("%w: RunOnce WithMaxHold %v is below atLeastFor %v", ErrInvalidOption, cfg.MaxHold, atLeastFor)
		}
		maxHold = cfg.MaxHold
	}
	opts = append(opts[:len(opts):len(opts)], WithTTL(ttl), WithMaxHold(maxHold))
	start := time.Now()
	lk, err := tryTransient(ctx, l, key, cfg.Backoff, opts)
	var held *NotAcquiredError
	switch {
	case errors.As(err, &held):
		return false, nil
	case err != nil:
		return false, err
	case lk == nil:
		return false, fmt.Errorf("dlock: RunOnce %q: the Locker returned neither a lock nor an error", key)
	}
	fctx, cancel := lk.Context(ctx)
	defer func() {
		// Also while a panic unwinds: the lock is released (at atLeastFor).
		cancel()
		lost := lk.Err()
		if lost != nil && !errors.Is(lost, ErrReleased) {
			err = errors.Join(err, lost)
		}
		if wait := time.Until(start.Add(atLeastFor)); wait > 0 && lost == nil {
			background.AfterFunc(wait, func() { _ = lk.Release(context.Background()) })
			return
		}
		// Release honours ctx (an ended one gets DefaultReleaseTimeout):
		// against a hung service RunOnce returns by its deadline and the
		// release goes on in the background.
		if rerr := lk.Release(ctx); rerr != nil && lost == nil {
			err = errors.Join(err, rerr)
		}
	}()
	return true, fn(fctx)
}

// RunOnceAttempts bounds the attempts RunOnce makes when they fail
// transiently.
const RunOnceAttempts = 3

const runOnceRetryMin = 50 * time.Millisecond

// tryTransient is TryAcquire, repeated after a backoff step while it fails
// with ErrTransient, up to RunOnceAttempts attempts.
func tryTransient(ctx context.Context, l Locker, key string, b Backoff, opts []Option) (*Lock, error) {
	for n := 1; ; n++ {
		lk, err := l.TryAcquire(ctx, key, opts...)
		if err == nil || !errors.Is(err, ErrTransient) || n == RunOnceAttempts {
			return lk, err
		}
		// At least runOnceRetryMin: a transient failure on a fresh
		// connection (a dial, a script load) needs that long to clear.
		t := time.NewTimer(max(b.Next(n), runOnceRetryMin))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctxErr(ctx))
		}
	}
}
