package dlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/background"
)

// Renewal is one lease due for renewal, with the TTL to set.
type Renewal struct {
	Lease Lease
	TTL   time.Duration
}

// BatchRenewer is implemented by backends that renew many leases in one
// round trip (a Redis pipeline, one SQL statement). RefreshBatch calls
// done(i, err) once for each renewal, as soon as its outcome is known (a
// backend that talks to several servers reports each server's renewals
// when that server answers, so a hung one delays only its own), from any
// goroutine, before it returns; err has the same meaning as for
// Lease.Refresh. A renewal without a report counts as failed.
type BatchRenewer interface {
	RefreshBatch(ctx context.Context, rs []Renewal, done func(i int, err error))
}

// watchdog keeps the locks of one Acquirer: it renews auto-refreshed
// leases, batching all locks due within a short window into one
// RefreshBatch call, and loses every lock whose local deadline passed.
//
// Timing never waits on I/O. A single timer fires at the earliest renewal
// or deadline of any lock; its pass (on the timer's own goroutine) first
// loses the locks whose deadline passed and re-arms the timer for the next
// event, and only then starts the renewal of the locks due, on the same
// goroutine. A renewal that hangs (a stalled link, a hung server, a client
// that ignores contexts) therefore holds up nothing: the timer fires again
// for the next deadline, a lock added meanwhile is scheduled at once, and a
// lock whose renewal is in flight is skipped by later passes until that
// renewal reports (its deadline still fires on time).
//
// There is no goroutine and no timer per lock: acquiring a lock touches the
// timer only when the new lock is due before everything else, so a lock
// released before its first renewal usually costs no timer operation at
// all (on the 2-core benchmark machine each timer change woke a thread and
// cost ~10% of an uncontended acquire+release).
type watchdog struct {
	batch BatchRenewer // nil: renew leases one by one

	mu      sync.Mutex
	locks   map[*Lock]*wdEntry
	timer   *time.Timer
	timerAt time.Time // when the timer fires; zero when not armed
}

type wdEntry struct {
	renewAt  time.Time // zero: auto-refresh off
	deadline time.Time // the lock's local deadline (copy, under w.mu)
	inflight bool      // a renewal of this lock is running
}

// due is the next time a pass has something to do for the entry.
func (e *wdEntry) due() time.Time {
	if !e.inflight && !e.renewAt.IsZero() && e.renewAt.Before(e.deadline) {
		return e.renewAt
	}
	return e.deadline
}

func newWatchdog(b BatchRenewer) *watchdog {
	return &watchdog{batch: b, locks: map[*Lock]*wdEntry{}}
}

// add tracks l. Called with l.mu held (lock order: l.mu, then w.mu).
func (w *watchdog) add(l *Lock, renewAt, deadline time.Time) {
	w.mu.Lock()
	e := &wdEntry{renewAt: renewAt, deadline: deadline}
	w.locks[l] = e
	w.armLocked(e.due())
	w.mu.Unlock()
}

// remove stops tracking l. The timer is left armed: a pass with nothing
// to do costs less than stopping and re-arming the timer on every release.
func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	delete(w.locks, l)
	w.mu.Unlock()
}

// setDeadline records a later deadline (after a renewal). Called with
// l.mu held. The timer needs no change: deadlines only move later.
func (w *watchdog) setDeadline(l *Lock, d time.Time) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		e.deadline = d
	}
	w.mu.Unlock()
}

// rearm makes sure a pass runs by l's next due time.
func (w *watchdog) rearm(l *Lock) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		w.armLocked(e.due())
	}
	w.mu.Unlock()
}

// renewDone ends l's renewal in flight and schedules the next one at at.
func (w *watchdog) renewDone(l *Lock, at time.Time) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		e.inflight = false
		e.renewAt = at
		w.armLocked(e.due())
	}
	w.mu.Unlock()
}

// armLocked makes sure a pass runs no later than at. w.mu held.
func (w *watchdog) armLocked(at time.Time) {
	if !w.timerAt.IsZero() && !at.Before(w.timerAt) {
		return
	}
	d := time.Until(at)
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.pass)
	} else {
		w.timer.Reset(d)
	}
	w.timerAt = at
}

// held reports the number of locks under renewal (for tests and metrics).
func (w *watchdog) held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.locks {
		if !e.renewAt.IsZero() {
			n++
		}
	}
	return n
}

// pass runs on the timer's goroutine: it loses the locks past their
// deadline, re-arms the timer for the next event, then renews what is due.
func (w *watchdog) pass() {
	w.mu.Lock()
	w.timerAt = time.Time{}
	now := time.Now()
	var due, expired []*Lock
	var next time.Time
	for l, e := range w.locks {
		if !now.Before(e.deadline) {
			expired = append(expired, l)
			continue
		}
		// Coalesce: renew every lock due within 1/12 of its TTL now, so
		// locks taken at nearly the same time share a round trip.
		if !e.inflight && !e.renewAt.IsZero() && !e.renewAt.After(now.Add(l.cfg.TTL/12)) {
			e.inflight = true
			due = append(due, l)
		}
		if at := e.due(); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if !next.IsZero() {
		w.armLocked(next)
	}
	w.mu.Unlock()
	// Close every expired lock's Lost() first, then start the cleanups:
	// with thousands of locks due at once, no Lost() waits behind another
	// lock's goroutine start.
	var cleanups []*Lock
	for _, l := range expired {
		if l.deadlinePassed() {
			cleanups = append(cleanups, l)
		}
	}
	for _, l := range cleanups {
		background.Go(l.cleanup)
	}
	if len(due) > 0 {
		w.renew(due)
	}
}

// renew refreshes due locks in one batch and applies each outcome as soon
// as the backend reports it. The call's context ends at the latest
// deadline among them: no answer after that can save any of them.
func (w *watchdog) renew(due []*Lock) {
	start := time.Now()
	rs := make([]Renewal, 0, len(due))
	locks := make([]*Lock, 0, len(due))
	var last time.Time
	for _, l := range due {
		ttl, ok := l.renewTTL(start)
		if !ok {
			l.lose("hold cap reached", ErrHoldCapReached, true)
			continue
		}
		rs = append(rs, Renewal{Lease: l.lease, TTL: ttl})
		locks = append(locks, l)
		if d := l.Deadline(); d.After(last) {
			last = d
		}
	}
	if len(rs) == 0 {
		return
	}
	// Give the call at least a few ms so a near-due lock still gets a try.
	if min := start.Add(5 * time.Millisecond); last.Before(min) {
		last = min
	}
	ctx, cancel := context.WithDeadline(context.Background(), last)
	defer cancel()
	reported := make([]atomic.Bool, len(rs))
	done := func(i int, err error) {
		if i < 0 || i >= len(rs) || reported[i].Swap(true) {
			return // out of range or reported twice: ignore
		}
		w.apply(locks[i], start, rs[i].TTL, err)
	}
	switch {
	case w.batch != nil:
		w.batch.RefreshBatch(ctx, rs, done)
	case len(rs) == 1:
		done(0, rs[0].Lease.Refresh(ctx, rs[0].TTL))
	default:
		// One at a time would let a slow lease hold up the others.
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() { done(i, r.Lease.Refresh(ctx, r.TTL)) })
		}
		wg.Wait()
	}
	for i := range rs {
		done(i, errNoRenewalResult) // no-op for the reported ones
	}
}

var errNoRenewalResult = errors.New("dlock: the backend reported no result for this renewal")

// apply records the outcome of l's renewal sent at start.
func (w *watchdog) apply(l *Lock, start time.Time, ttl time.Duration, err error) {
	switch {
	case err == nil:
		if l.renewed(start, ttl) {
			w.renewDone(l, start.Add(ttl/3))
		}
	case errors.Is(err, ErrNotHeld):
		l.lose("renewal refused: the key was deleted, expired or taken", err, false)
	default:
		// Transient: try again soon; the local deadline decides loss.
		w.renewDone(l, time.Now().Add(max(l.cfg.TTL/10, 10*time.Millisecond)))
	}
}
