package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// MaxSetKeys bounds the number of keys AcquireAll takes at once.
const MaxSetKeys = 1024

// Set is several locks held together: what AcquireAll and TryAcquireAll
// return. It is safe for concurrent use. The set is lost as soon as any of
// its locks is: Lost() closes and Err() names that lock's loss.
type Set struct {
	locks []*Lock // sorted by key
	stops []func() bool
	life  context.Context
	lose  context.CancelCauseFunc

	mu       sync.Mutex
	released bool
	relDone  chan struct{} // closed when the first Release has finished
}

// AcquireAll acquires every key in keys, with the same options, and returns
// them as one Set, or none of them. Keys are taken in sorted order (and
// duplicates once), whatever order they are given in, so two callers whose
// key sets overlap never wait for each other in a cycle: AcquireAll cannot
// deadlock against AcquireAll, or against code that takes locks in the
// same sorted order. If a key cannot be had (ctx ends, WithWait elapses for
// one key, an error), the keys taken so far are released, in reverse
// order, before AcquireAll returns that key's error.
//
// WithWait bounds the wait for each key; ctx bounds the whole. Every lock
// of the set has its own lease, token and watchdog renewal. A lock lost
// while AcquireAll waited for a later key makes the returned Set lost
// from the start (Lost closed, Err naming the loss).
func AcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*Set, error) {
	return acquireAll(ctx, l, keys, opts, true)
}

// TryAcquireAll is AcquireAll without waiting: one attempt per key, in
// sorted order, stopping at the first held key (an error wrapping
// ErrNotAcquired naming it), with the keys taken so far released.
func TryAcquireAll(ctx context.Context, l Locker, keys []string, opts ...Option) (*Set, error) {
	return acquireAll(ctx, l, keys, opts, false)
}

func acquireAll(ctx context.Context, l Locker, keys []string, opts []Option, wait bool) (*Set, error) {
	switch {
	case l == nil || isNilPointer(l):
		return nil, ErrNilClient
	case ctx == nil:
		return nil, errNilContext
	case len(keys) == 0:
		return nil, fmt.Errorf("%w: AcquireAll of no keys", ErrInvalidKey)
	case len(keys) > MaxSetKeys:
		return nil, fmt.Errorf("%w: AcquireAll of %d keys (at most %d)", ErrInvalidKey, len(keys), MaxSetKeys)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	for _, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return nil, err
		}
	}
	s := &Set{}
	for _, k := range sorted {
		var (
			lk  *Lock
			err error
		)
		if wait {
			lk, err = l.Acquire(ctx, k, opts...)
		} else {
			lk, err = l.TryAcquire(ctx, k, opts...)
		}
		if err == nil && lk == nil {
			err = fmt.Errorf("dlock: acquire %q: the Locker returned neither a lock nor an error", k)
		}
		if err != nil {
			if rerr := s.releaseLocks(ctx); rerr != nil {
				err = errors.Join(err, fmt.Errorf("dlock: releasing the keys taken before %q: %w", k, rerr))
			}
			return nil, err
		}
		s.locks = append(s.locks, lk)
	}
	s.life, s.lose = context.WithCancelCause(context.Background())
	// A lock lost while a later key was awaited makes the returned set lost
	// already, as its caller sees it: an AfterFunc on a context already
	// done runs in a goroutine of its own, a moment too late for an Err or
	// Lost checked right after AcquireAll returns.
	for _, lk := range s.locks {
		if err := lk.Err(); err != nil && !errors.Is(err, ErrReleased) {
			s.lose(err)
			break
		}
	}
	for _, lk := range s.locks {
		lk := lk
		s.stops = append(s.stops, context.AfterFunc(lk.life, func() {
			if err := lk.Err(); err != nil && !errors.Is(err, ErrReleased) {
				s.lose(err)
			}
		}))
	}
	return s, nil
}

// Locks returns the set's locks, sorted by key. Use them for their fencing
// tokens; release the set, not its locks one by one.
func (s *Set) Locks() []*Lock {
	if s == nil {
		return nil
	}
	return slices.Clone(s.locks)
}

// Lock returns the set's lock of key, or nil.
func (s *Set) Lock(key string) *Lock {
	if s == nil {
		return nil
	}
	i, ok := slices.BinarySearchFunc(s.locks, key, func(l *Lock, k string) int {
		switch {
		case l.key < k:
			return -1
		case l.key > k:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return s.locks[i]
}

// Lost returns a channel closed when any lock of the set is lost, or when
// the set is released (already closed for a nil *Set).
func (s *Set) Lost() <-chan struct{} {
	if s == nil || s.life == nil {
		return closedChan
	}
	return s.life.Done()
}

// Err is nil while every lock of the set is held; after that it is the
// first loss (an error wrapping ErrLockLost) or ErrReleased.
func (s *Set) Err() error {
	if s == nil || s.life == nil {
		return errNilLock
	}
	if s.life.Err() == nil {
		return nil
	}
	return context.Cause(s.life)
}

// Context returns a context derived from parent that is also cancelled,
// with Err() as its cause, when any lock of the set is lost or the set is
// released. Call cancel when done with it.
func (s *Set) Context(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancelCause(parent)
	if s == nil || s.life == nil {
		cancel(errNilLock)
		return ctx, func() {}
	}
	if s.life.Err() != nil {
		// Already lost or released: done now, not a moment later from
		// the goroutine an AfterFunc on a done context runs in.
		cancel(s.Err())
		return ctx, func() {}
	}
	stop := context.AfterFunc(s.life, func() { cancel(s.Err()) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// Release releases every lock of the set, in reverse order of acquisition,
// and returns their errors joined: nil if all were held to the end, an
// error wrapping ErrLockLost if one was lost (the work done under the set
// may not have been exclusive). A second Release returns the first's
// loss, if any, without touching the server again.
func (s *Set) Release(ctx context.Context) error {
	if s == nil || s.life == nil {
		return errNilLock
	}
	s.mu.Lock()
	again := s.released
	if !again {
		s.released = true
		s.relDone = make(chan struct{})
	}
	done := s.relDone
	s.mu.Unlock()
	if again {
		// The first's outcome, once it is known: a concurrent second
		// Release must not report a clean release the first may yet find
		// lost.
		if ctx == nil {
			ctx = context.Background()
		}
		select {
		case <-done:
		case <-ctx.Done():
			select {
			case <-done:
			default:
				return fmt.Errorf("%w: the set's release is still under way: %w", ErrUnavailable, ctxErr(ctx))
			}
		}
		if err := s.Err(); err != nil && !errors.Is(err, ErrReleased) {
			return err
		}
		return nil
	}
	defer close(done)
	for _, stop := range s.stops {
		stop()
	}
	err := s.releaseLocks(ctx)
	// A loss this Release found (a lease gone from the server before the
	// watchdog noticed) is the set's loss, for Err and a second Release,
	// not a plain release: the AfterFuncs that record losses were stopped
	// above.
	var lost *LostError
	if errors.As(err, &lost) {
		s.lose(lost)
	} else if errors.Is(err, ErrLockLost) {
		s.lose(err)
	}
	if s.life.Err() == nil {
		s.lose(ErrReleased)
	}
	return err
}

// releaseLocks releases the locks in reverse order. While ctx lasts each
// Release is bounded by it; once it has ended (or when it had ended before
// the call: AcquireAll's undo after its context ended), the remaining
// releases run together, bounded by one DefaultReleaseTimeout between them
// all, instead of one after the other with a fresh DefaultReleaseTimeout
// each: against a hung service that would keep the caller for N times
// that.
func (s *Set) releaseLocks(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background() // as Lock.Release takes it
	}
	errs := make([]error, len(s.locks))
	i := len(s.locks) - 1
	for ; i >= 0 && ctx.Err() == nil; i-- {
		errs[i] = s.locks[i].Release(ctx)
	}
	if i >= 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultReleaseTimeout)
		defer cancel()
		var wg sync.WaitGroup
		for ; i >= 0; i-- {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = s.locks[i].Release(rctx)
			}(i)
		}
		wg.Wait()
	}
	slices.Reverse(errs)
	return errors.Join(errs...)
}
