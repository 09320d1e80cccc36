package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// Schedule runs a job on at most one replica at a time with ShedLock's
// two bounds, over any dlock.Locker:
//
//   - AtMostFor: a run keeps the lock no longer than this after it
//     started, whatever happens to it. The lock is taken with
//     dlock.WithMaxHold(AtMostFor): its lease is renewed while the job
//     runs (a job may be longer than TTL) but never past start+AtMostFor,
//     when the job's context is cancelled and the lock freed. A crashed
//     runner renews nothing: its lock is free within TTL.
//   - AtLeastFor: a run keeps the lock at least this long after it
//     started, even if the job took a millisecond, so that a replica
//     whose cron fires a little later (clock skew) finds it held and
//     skips, instead of running the job a second time for the same
//     period. Fire holds the lock (renewed) until start+AtLeastFor, then
//     releases it. Since TTL ≥ AtLeastFor, the first lease alone reaches
//     past start+AtLeastFor: a runner that crashes right after a fast job
//     still keeps the period blocked until then.
//
// One lock per job (Name); a replica that finds it held skips the run
// (TryAcquire), it never waits.
type Schedule struct {
	Locker                dlock.Locker
	Name                  string
	TTL                   time.Duration
	AtLeastFor, AtMostFor time.Duration
	Replica               string // stored with the lock, to name the holder
}

// Run is one replica's cron firing.
type Run struct {
	Ran    bool      // false: skipped, the lock was held
	Holder string    // the holder seen, when skipped
	Start  time.Time // when the attempt began
	// Acquired is when TryAcquire returned the lock (Ran only): the
	// server granted it between Start and Acquired.
	Acquired time.Time
	JobEnd   time.Time // when the job returned
	Freed    time.Time // when the lock was released (or found lost)
	JobErr   error     // the job's error
	// LockErr is nil when the lock was held throughout the run and
	// released; else why not (an error wrapping dlock.ErrLockLost; with
	// dlock.ErrHoldCapReached when the run exceeded AtMostFor).
	LockErr error
}

func (s Schedule) check() error {
	if s.AtLeastFor > s.TTL || s.TTL > s.AtMostFor {
		return fmt.Errorf("schedule %q: want AtLeastFor (%v) ≤ TTL (%v) ≤ AtMostFor (%v)", s.Name, s.AtLeastFor, s.TTL, s.AtMostFor)
	}
	return nil
}

// Fire is a replica's cron firing: run job unless another replica runs it
// or ran it less than AtLeastFor ago. job's context is cancelled if the
// lock is lost (AtMostFor reached, or a renewal refused). Fire returns
// once the lock is free again (after AtLeastFor at least); an error only
// when the backend could not say whether the lock is held.
func (s Schedule) Fire(ctx context.Context, job func(ctx context.Context) error) (Run, error) {
	if err := s.check(); err != nil {
		return Run{}, err
	}
	r := Run{Start: time.Now()}
	lk, err := s.Locker.TryAcquire(ctx, s.Name, dlock.WithTTL(s.TTL), dlock.WithMaxHold(s.AtMostFor),
		dlock.WithMetadata("replica", s.Replica))
	var held *dlock.NotAcquiredError
	if errors.As(err, &held) {
		if len(held.Holders) > 0 {
			r.Holder = held.Holders[0].Metadata["replica"]
		}
		return r, nil
	}
	if err != nil {
		return r, err
	}
	r.Ran, r.Acquired = true, time.Now()
	jctx, cancel := lk.Context(ctx)
	r.JobErr = job(jctx)
	cancel()
	r.JobEnd = time.Now()
	// At least for: keep the lock until start+AtLeastFor, whatever the
	// caller's context says (at most AtLeastFor ≤ TTL more).
	if wait := time.Until(r.Start.Add(s.AtLeastFor)); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-lk.Lost():
		}
		t.Stop()
	}
	r.LockErr = lk.Release(context.WithoutCancel(ctx))
	r.Freed = time.Now()
	return r, nil
}
