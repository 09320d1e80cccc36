package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
//     process exits or dies meanwhile its lease (TTL ≥ atLeastFor) still
//     covers atLeastFor.
//   - atMostFor: the lock is never held longer than this: fn's context is
//     cancelled at atMostFor (dlock.WithMaxHold) or when the lock is lost,
//     and a runner that dies keeps the key for at most atMostFor after its
//     death.
//
// Both bounds hold on every backend that accepts them. A backend may
// grant another lease than the one asked for, or end it otherwise than
// by expiry, so RunOnce checks the lease it got before fn runs; when the
// lease cannot honour a bound it releases the key and returns ran = false
// with an error wrapping ErrInvalidOption that says why:
//
//   - atLeastFor > 0 on a lease that ends when its client closes its
//     connection or session (zklock: the lock's node is ephemeral, and a
//     process that closes its connection as it exits deletes it at once);
//   - a lease shorter than atLeastFor: a runner that died right after the
//     job would free the key early;
//   - a lease that a dead runner may keep longer than atMostFor: its TTL
//     (etcdlock rounds it up to whole seconds), or longer where the
//     server keeps a dead client's lease past it (zklock: until the
//     ensemble expires the session, zklock.LingerOf the session timeout,
//     twice that timeout).
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
		// atLeastFor covered (the lease must outlive it: a lost lock is
		// released no sooner than atLeastFor, and expires at its cap).
		if cfg.MaxHold < atLeastFor {
			return false, fmt.Errorf("%w: RunOnce WithMaxHold %v is below atLeastFor %v", ErrInvalidOption, cfg.MaxHold, atLeastFor)
		}
		maxHold = cfg.MaxHold
	}
	start := time.Now()
	keepUntil := start.Add(atLeastFor)
	opts = append(opts[:len(opts):len(opts)], WithTTL(ttl), WithMaxHold(maxHold), func(c *config) { c.releaseNotBefore = &keepUntil })
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
	if err := runOnceBounds(lk, atMostFor, atLeastFor); err != nil {
		// Refused before fn runs: nothing ran, the key is free again.
		if rerr := lk.Release(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return false, err
	}
	fctx, cancel := lk.Context(ctx)
	defer func() {
		// Also while a panic unwinds: the lock is released (at atLeastFor).
		cancel()
		lost := lk.Err()
		if lost != nil && !errors.Is(lost, ErrReleased) {
			err = errors.Join(err, lost)
		}
		// The key stays taken until atLeastFor, also when the lock was
		// lost meanwhile (at its cap or deadline, which drift allowance
		// puts before atLeastFor when atMostFor or the TTL equals it):
		// the lock's own cleanup waits for it too.
		if wait := time.Until(keepUntil); wait > 0 {
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

// runOnceBounds checks the lease lk got against RunOnce's bounds: a
// backend may grant another lease than the one asked for (a ZooKeeper
// session's, etcd's whole seconds) or end it otherwise than by expiry.
// An error wraps ErrInvalidOption and says which bound the backend cannot
// honour.
func runOnceBounds(lk *Lock, atMostFor, atLeastFor time.Duration) error {
	ttl := lk.TTL()
	switch {
	case atLeastFor > 0 && lk.endsWithClient:
		return fmt.Errorf("%w: RunOnce %q: atLeastFor %v cannot be honoured: the backend's lease ends when this client closes its connection or session (a ZooKeeper ephemeral node), so a process that exits cleanly after RunOnce returns frees the key at once; use atLeastFor 0 or a backend whose leases outlive their client",
			ErrInvalidOption, lk.Key(), atLeastFor)
	case ttl < atLeastFor.Truncate(time.Millisecond):
		return fmt.Errorf("%w: RunOnce %q: atLeastFor %v cannot be honoured: the backend granted a %v lease, which a runner that dies right after the job would keep for less than atLeastFor",
			ErrInvalidOption, lk.Key(), atLeastFor, ttl)
	}
	if linger := max(ttl, lk.linger); linger > atMostFor {
		return fmt.Errorf("%w: RunOnce %q: atMostFor %v cannot be honoured: a runner that dies would keep the key for up to %v (the backend's lease: TTL %v), longer than atMostFor",
			ErrInvalidOption, lk.Key(), atMostFor, linger, ttl)
	}
	return nil
}

// RunOnceAttempts bounds the attempts RunOnce makes when they fail
// transiently.
const RunOnceAttempts = 3

const runOnceRetryMin = 50 * time.Millisecond

// runOnceRetryDelay is the wait before RunOnce's attempt n+1: the
// backoff's step, at least runOnceRetryMin (a transient failure on a
// fresh connection, a dial or a script load, needs that long to clear),
// plus up to runOnceRetryMin more at random. Replicas that fired at once
// and split a quorum's votes must not retry at once too: with the
// default backoff every step is below the minimum, and without the
// random part they all waited exactly the minimum and split again.
func runOnceRetryDelay(b Backoff, n int) time.Duration {
	return max(b.Next(n), runOnceRetryMin) + rand.N(runOnceRetryMin)
}

// tryTransient is TryAcquire, repeated after a backoff step while it fails
// with ErrTransient, up to RunOnceAttempts attempts.
func tryTransient(ctx context.Context, l Locker, key string, b Backoff, opts []Option) (*Lock, error) {
	for n := 1; ; n++ {
		lk, err := l.TryAcquire(ctx, key, opts...)
		if err == nil || !errors.Is(err, ErrTransient) || n == RunOnceAttempts {
			return lk, err
		}
		t := time.NewTimer(runOnceRetryDelay(b, n))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctxErr(ctx))
		}
	}
}
