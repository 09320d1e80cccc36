package dlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Renewal is one lease due for renewal, with the TTL to set.
type Renewal struct {
	Lease Lease
	TTL   time.Duration
}

// BatchRenewer is implemented by backends that renew many leases in one
// round trip (a Redis pipeline, one SQL statement). RefreshBatch returns one
// error per renewal, in order, with the same meaning as Lease.Refresh.
type BatchRenewer interface {
	RefreshBatch(ctx context.Context, rs []Renewal) []error
}

// watchdog keeps the locks of one Acquirer: it renews auto-refreshed
// leases, batching all locks due within a short window into one
// RefreshBatch call, and loses every lock whose local deadline passed. It
// owns no goroutine and no timer per lock: a single timer fires at the
// earliest renewal or deadline and runs one pass on the timer's goroutine,
// which then re-arms it. Acquiring a lock touches the timer only when the
// new lock is due before everything else, so a lock released before its
// first renewal usually costs no timer operation at all (on the 2-core
// benchmark machine each timer change woke a thread and cost ~10% of an
// uncontended acquire+release).
type watchdog struct {
	batch BatchRenewer // nil: renew leases one by one

	mu      sync.Mutex
	locks   map[*Lock]*wdEntry
	running bool // a pass is in progress; it re-arms when done
	timer   *time.Timer
	timerAt time.Time // when the timer fires; zero when not armed
}

type wdEntry struct {
	renewAt  time.Time // zero: auto-refresh off
	deadline time.Time // the lock's local deadline (copy, under w.mu)
}

func (e *wdEntry) due() time.Time {
	if !e.renewAt.IsZero() && e.renewAt.Before(e.deadline) {
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
// l.mu held.
func (w *watchdog) setDeadline(l *Lock, d time.Time) {
	w.mu.Lock()
	if e := w.locks[l]; e != nil {
		e.deadline = d
	}
	w.mu.Unlock()
}

// armLocked makes sure a pass runs no later than at. A running pass
// re-arms from a full scan when it ends, so nothing is needed then.
func (w *watchdog) armLocked(at time.Time) {
	if w.running || (!w.timerAt.IsZero() && !at.Before(w.timerAt)) {
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

// pass runs on the timer's goroutine: it loses locks past their deadline
// and renews what is due until nothing is, then re-arms the timer.
func (w *watchdog) pass() {
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return
	}
	w.running = true
	w.timerAt = time.Time{}
	for {
		now := time.Now()
		var due, expired []*Lock
		var earliest time.Time // earliest deadline of every tracked lock
		for l, e := range w.locks {
			if !now.Before(e.deadline) {
				expired = append(expired, l)
				continue
			}
			if earliest.IsZero() || e.deadline.Before(earliest) {
				earliest = e.deadline
			}
			// Coalesce: renew every lock due within 1/12 of its TTL now, so
			// locks taken at nearly the same time share a round trip.
			if !e.renewAt.IsZero() && !e.renewAt.After(now.Add(l.cfg.TTL/12)) {
				due = append(due, l)
			}
		}
		if len(expired) == 0 && len(due) == 0 {
			break
		}
		w.mu.Unlock()
		for _, l := range expired {
			l.deadlinePassed()
		}
		if len(due) > 0 {
			w.renew(due, earliest)
		}
		w.mu.Lock()
	}
	w.running = false
	var wake time.Time
	for _, e := range w.locks {
		if at := e.due(); wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	if !wake.IsZero() {
		w.armLocked(wake)
	}
	w.mu.Unlock()
}

// renew refreshes due locks in one batch. The call is bounded by the
// earliest deadline of any tracked lock: waiting longer is useless, and
// the pass must be free by then to lose that lock on time.
func (w *watchdog) renew(due []*Lock, earliest time.Time) {
	start := time.Now()
	rs := make([]Renewal, 0, len(due))
	locks := due[:0]
	for _, l := range due {
		ttl, ok := l.renewTTL(start)
		if !ok {
			l.lose("hold cap reached", ErrHoldCapReached, true)
			continue
		}
		rs = append(rs, Renewal{Lease: l.lease, TTL: ttl})
		locks = append(locks, l)
	}
	if len(rs) == 0 {
		return
	}
	// Give the call at least a few ms so a near-due lock still gets a try.
	if min := start.Add(5 * time.Millisecond); earliest.Before(min) {
		earliest = min
	}
	ctx, cancel := context.WithDeadline(context.Background(), earliest)
	defer cancel()
	var errs []error
	if w.batch != nil {
		errs = w.batch.RefreshBatch(ctx, rs)
	} else {
		errs = make([]error, len(rs))
		for i, r := range rs {
			errs[i] = r.Lease.Refresh(ctx, r.TTL)
		}
	}
	after := time.Now()
	for i, l := range locks {
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = errors.New("dlock: backend returned too few renewal results")
		}
		switch {
		case err == nil:
			l.renewed(start, rs[i].TTL) // updates the deadline (l.mu, then w.mu)
			w.mu.Lock()
			if e := w.locks[l]; e != nil {
				e.renewAt = start.Add(rs[i].TTL / 3)
			}
			w.mu.Unlock()
		case errors.Is(err, ErrNotHeld):
			l.lose("renewal refused: the key was deleted, expired or taken", err, false)
		default:
			// Transient: try again soon; the local deadline decides loss.
			retry := max(l.cfg.TTL/10, 10*time.Millisecond)
			w.mu.Lock()
			if e := w.locks[l]; e != nil {
				e.renewAt = after.Add(retry)
			}
			w.mu.Unlock()
		}
	}
}
