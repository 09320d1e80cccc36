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

// watchdog renews every auto-refreshed lock of one Acquirer, batching all
// locks due within a short window into one RefreshBatch call. It owns no
// goroutine: a single timer fires at the earliest due time and runs one
// pass (renewals, then cleanup of lost locks) on the timer's goroutine,
// then re-arms itself. A lock released before its first renewal costs no
// goroutine at all, and an idle Locker holds only a stopped timer. It also
// performs best-effort server-side releases of lost locks, so a holder that
// missed its deadline frees the key as soon as the server is reachable.
type watchdog struct {
	batch BatchRenewer // nil: renew leases one by one

	mu      sync.Mutex
	next    map[*Lock]time.Time // lock -> time of its next renewal
	pending []*Lock             // lost locks to release on the server
	running bool                // a pass is in progress; it re-arms when done
	timer   *time.Timer
	timerAt time.Time // when the timer fires; zero when not armed
}

func newWatchdog(b BatchRenewer) *watchdog {
	return &watchdog{batch: b, next: map[*Lock]time.Time{}}
}

func (w *watchdog) add(l *Lock, at time.Time) {
	w.mu.Lock()
	w.next[l] = at
	w.armLocked(at)
	w.mu.Unlock()
}

func (w *watchdog) remove(l *Lock) {
	w.mu.Lock()
	delete(w.next, l)
	if len(w.next) == 0 && len(w.pending) == 0 && w.timer != nil && !w.timerAt.IsZero() {
		w.timer.Stop()
		w.timerAt = time.Time{}
	}
	w.mu.Unlock()
}

func (w *watchdog) cleanup(l *Lock) {
	w.mu.Lock()
	w.pending = append(w.pending, l)
	w.armLocked(time.Now())
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
		w.timer.Stop()
		w.timer.Reset(d)
	}
	w.timerAt = at
}

// held reports the number of locks under renewal (for tests and metrics).
func (w *watchdog) held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.next)
}

// pass runs on the timer's goroutine: it renews what is due and releases
// lost locks until nothing is due, then re-arms the timer.
func (w *watchdog) pass() {
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return
	}
	w.running = true
	w.timerAt = time.Time{}
	for {
		pending := w.pending
		w.pending = nil
		now := time.Now()
		var due []*Lock
		for l, at := range w.next {
			// Coalesce: renew every lock due within 1/12 of its TTL now, so
			// locks taken at nearly the same time share a round trip.
			if !at.After(now.Add(l.cfg.TTL / 12)) {
				due = append(due, l)
			}
		}
		if len(pending) == 0 && len(due) == 0 {
			break
		}
		w.mu.Unlock()
		for _, l := range pending {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultReleaseTimeout)
			_ = l.releaseServer(ctx)
			cancel()
		}
		if len(due) > 0 {
			w.renew(due)
		}
		w.mu.Lock()
	}
	w.running = false
	var wake time.Time
	for _, at := range w.next {
		if wake.IsZero() || at.Before(wake) {
			wake = at
		}
	}
	if !wake.IsZero() {
		w.armLocked(wake)
	}
	w.mu.Unlock()
}

// renew refreshes due locks in one batch, bounded by the earliest deadline.
func (w *watchdog) renew(due []*Lock) {
	start := time.Now()
	rs := make([]Renewal, 0, len(due))
	locks := due[:0]
	var deadline time.Time
	for _, l := range due {
		ttl, ok := l.renewTTL(start)
		if !ok {
			l.lose("hold cap reached", ErrHoldCapReached, true)
			continue
		}
		if d := l.Deadline(); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
		rs = append(rs, Renewal{Lease: l.lease, TTL: ttl})
		locks = append(locks, l)
	}
	if len(rs) == 0 {
		return
	}
	// Waiting past the earliest deadline is useless: that lock is lost then.
	// Give the call at least a few ms so a near-due lock still gets a try.
	if min := start.Add(5 * time.Millisecond); deadline.Before(min) {
		deadline = min
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
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
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, l := range locks {
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = errors.New("dlock: backend returned too few renewal results")
		}
		if _, ok := w.next[l]; !ok {
			continue // released or lost meanwhile
		}
		switch {
		case err == nil:
			w.next[l] = start.Add(rs[i].TTL / 3)
			w.mu.Unlock()
			l.renewed(start, rs[i].TTL)
			w.mu.Lock()
		case errors.Is(err, ErrNotHeld):
			delete(w.next, l)
			w.mu.Unlock()
			l.lose("renewal refused: the key was deleted, expired or taken", err, false)
			w.mu.Lock()
		default:
			// Transient: try again soon; the local deadline decides loss.
			retry := l.cfg.TTL / 10
			if retry < 10*time.Millisecond {
				retry = 10 * time.Millisecond
			}
			w.next[l] = after.Add(retry)
		}
	}
}
