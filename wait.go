package dlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// acquire waits for (wait) or tries once for the lock cfg describes.
func (e *Engine) acquire(ctx context.Context, cfg *config, wait bool) (*Lock, error) {
	if wait && cfg.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Wait)
		defer cancel()
	}
	if wait && e.queuer != nil {
		return e.queue(ctx, cfg)
	}
	return e.poll(ctx, cfg, wait)
}

// answerRecency: an attempt cut off by its context's end after the key
// was seen held reports that holder (ErrNotAcquired) only if it was sent
// less than this long before; a server that left it unanswered longer is
// hung or cut off, and the error is ErrUnavailable.
const answerRecency = time.Second

// Bounds of the grace an attempt in flight gets once its context ends.
const (
	minAttemptGrace = 5 * time.Millisecond
	maxAttemptGrace = 100 * time.Millisecond
)

// observe feeds an answered attempt's duration into the moving average.
func (e *Engine) observe(d time.Duration) {
	old := e.rtt.Load()
	if old == 0 {
		e.rtt.Store(int64(d))
		return
	}
	e.rtt.Store(old + (int64(d)-old)/8) // approximate under races: fine
}

// attemptGrace is how long an attempt still in flight when its context
// ends may take to answer before it is abandoned: four recent round trips,
// within [5ms, 100ms]. A healthy server answers within it, so a wait that
// ends mid-attempt reports what the server said (the holder, or the lock);
// a hung one is reported unavailable that much after the deadline.
func (e *Engine) attemptGrace() time.Duration {
	return min(max(4*time.Duration(e.rtt.Load()), minAttemptGrace), maxAttemptGrace)
}

// queuedPollMin is the shortest fallback poll of an exclusive waiter that
// is queued for a wake-up by name (a WaitID) and listening, under
// DefaultBackoff: a
// missed wake-up (a lost pub/sub connection wakes every listener anyway)
// delays it by at most this much more than the backoff step, and a lease
// that expires without a release still sets an earlier retry (the
// holder's TTL seen by the last attempt).
const queuedPollMin = 50 * time.Millisecond

// waiter is the state of one acquisition across its attempts.
type waiter struct {
	e       *Engine
	cfg     *config
	waitID  string
	waiter  string            // Request.Waiter: set for a blocking Acquire
	last    *NotAcquiredError // the holders seen by the last attempt, if it saw some
	lastErr error             // the last transient failure, if the last attempt failed so
}

// ended is the error of an acquisition whose context ended between
// attempts: ErrNotAcquired naming the holders the last attempt saw, or
// the last attempt's transient failure, in one line with the context's
// error. That failure says whether the service was out (ErrUnavailable,
// e.g. fewer replicas connected than acknowledgements asked for) or only
// contended (a split vote): ended adds no verdict of its own.
func (w *waiter) ended(ctx context.Context) error {
	switch {
	case w.last != nil:
		return notAcquired(w.cfg.key, w.last, ctxErr(ctx))
	case w.lastErr != nil:
		return fmt.Errorf("dlock: acquire %q: the context ended (%w) after a failed attempt: %w", w.cfg.key, ctxErr(ctx), w.lastErr)
	}
	return fmt.Errorf("dlock: acquire %q: %w", w.cfg.key, ctxErr(ctx))
}

// attempt makes one attempt with fn (the driver's Try or Queue), bounded
// by ctx plus grace. It returns the Lock, or done with the error that ends
// the acquisition, or neither: the attempt saw holders (w.last) or failed
// transiently (w.lastErr) and the caller may wait and try again.
func (w *waiter) attempt(ctx context.Context, n int, fn func(context.Context, *driver.Request) (driver.Grant, error), grace time.Duration, rtt bool) (lk *Lock, done bool, err error) {
	e, cfg := w.e, w.cfg
	if cfg.stampAcquired && n > 1 {
		// The acquisition time is this attempt's. A fresh map: an earlier
		// attempt abandoned to the background may still be encoding its
		// own.
		md := maps.Clone(cfg.Metadata)
		md[MetaAcquired] = acquiredNow()
		cfg.Metadata = md
	}
	// A fresh owner per attempt: a driver cleaning up a failed attempt in
	// the background can never touch a later one.
	req := &driver.Request{Key: cfg.key, Owner: NewOwner(), TTL: cfg.TTL, Metadata: cfg.Metadata, Mode: driver.Mode(cfg.mode), Limit: cfg.limit, WaitID: w.waitID, Waiter: w.waiter, Attempt: n}
	cfg.attempts = n
	if e.src.obs != nil || cfg.callObs != nil {
		e.src.emitCall(cfg.callObs, Event{Kind: EventAttempt, Key: cfg.key, Mode: cfg.mode, Attempts: n})
	}
	start := e.wd.clk.Now()
	g, err, abandoned := callGrace(ctx, e.wd.clk, grace, func(ctx context.Context) (driver.Grant, error) {
		return fn(ctx, req)
	}, func(g driver.Grant, err error) {
		e.undo(req, g, err)
		// An abandoned attempt ended the Acquire, whose Leave may have run
		// before this attempt reached the server and registered the waiter
		// again: leave once more, now that it is over.
		if w.registers() {
			w.leaveNow()
		}
	})
	if abandoned {
		return nil, true, unavailable(ctx, cfg.key, w.last, nil, w.lastErr)
	}
	if rtt && ctx.Err() == nil {
		e.observe(clockSince(e.wd.clk, start))
	}
	if err == nil {
		if lk, err = e.grant(req, cfg, g, start); err == nil {
			return lk, true, nil
		}
	}
	var na *NotAcquiredError
	switch {
	case w.last != nil && ctx.Err() != nil && isContextErr(err, ctx) && clockSince(e.wd.clk, start) < answerRecency:
		// The attempt stopped because the wait ended (the driver gave up
		// on the context it was handed, promptly) before a healthy server
		// was overdue: the key was seen held and nothing says otherwise.
		// An attempt unanswered for answerRecency is an outage (below),
		// whatever error the driver made of the context's end. The
		// request may still have been sent and take effect late (a
		// statement a loaded server runs after its client left, granting
		// the key to nobody): undo it in the background, as any attempt
		// whose outcome is unknown.
		failed := err
		background.Go(func() { e.undo(req, driver.Grant{}, failed) })
		return nil, true, notAcquired(cfg.key, w.last, ctxErr(ctx))
	case errors.As(err, &na):
		w.last, w.lastErr = na, nil
		return nil, false, err
	case errors.Is(err, ErrTransient) && ctx.Err() != nil && isContextErr(err, ctx):
		// The failure is the context's end (a quorum of nodes unanswered
		// when it came): an outage, not a refusal a retry could change.
		return nil, true, unavailable(ctx, cfg.key, w.last, err, w.lastErr)
	case errors.Is(err, ErrTransient):
		w.last, w.lastErr = nil, err
		return nil, false, err
	default:
		// The outcome is unknown (a reset connection, a timeout, the
		// context ending mid-request): undo it in the background.
		failed := err // err is the named result, written by the returns below
		background.Go(func() { e.undo(req, driver.Grant{}, failed) })
		if ctx.Err() != nil {
			return nil, true, unavailable(ctx, cfg.key, w.last, err, w.lastErr)
		}
		return nil, true, err
	}
}

// sleep waits for the backoff step after attempt n (shortened to when a
// seen lease expires), a release notification on notify, or ctx's end. It
// reports false when notify was closed (the subscription is dead).
func (w *waiter) sleep(ctx context.Context, n int, notify <-chan struct{}) bool {
	d := w.cfg.Backoff.Next(n)
	if d <= 0 {
		d = time.Millisecond // a Backoff returning ≤ 0 must not spin
	}
	if w.waitID != "" && notify != nil && w.cfg.backoffDefault && w.cfg.mode == Exclusive {
		// Queued and listening for an exclusive lock: a release wakes
		// this waiter by name, so the default schedule's first steps
		// would only add load to a contended key (every waiter polling
		// every few milliseconds). Shared and limited waiters are woken
		// along chains of pokes, and keep the default schedule.
		d = max(d, queuedPollMin)
	}
	if w.last != nil {
		if ttl := w.last.soonest(); ttl > 0 && ttl+time.Millisecond < d {
			d = ttl + time.Millisecond // a lease expires by then
		}
	}
	if w.registers() {
		// A waiting writer's registration expires a TTL after its last
		// attempt (driver: Writer preference): attempt again well before.
		d = min(d, w.cfg.TTL/3)
	}
	t, fired := w.e.wd.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-fired:
	case _, ok := <-notify:
		return ok
	case <-ctx.Done():
	}
	return true
}

// registers reports whether this waiter's refused attempts register it as
// a waiting writer (see driver.Leaver).
func (w *waiter) registers() bool {
	return w.waiter != "" && w.e.leaver != nil && w.cfg.mode == Exclusive
}

// leave withdraws a waiting writer's registration, in the background,
// once its Acquire ended without the key.
func (w *waiter) leave() {
	if !w.registers() {
		return
	}
	background.Go(w.leaveNow)
}

// leaveNow is leave's call, made by the calling goroutine with its own
// bounded context.
func (w *waiter) leaveNow() {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultReleaseTimeout)
	defer cancel()
	_ = w.e.leaver.Leave(ctx, w.cfg.key, w.waiter)
}

// queue is a blocking Acquire on a driver with a server-side queue: the
// driver waits for its turn itself; a transient failure is retried after
// a backoff step.
func (e *Engine) queue(ctx context.Context, cfg *config) (*Lock, error) {
	w := &waiter{e: e, cfg: cfg}
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return nil, w.ended(ctx)
		}
		lk, done, err := w.attempt(ctx, n, e.queuer.Queue, queueGrace, false)
		if done || w.last != nil { // a queue reports holders only when ctx ended
			return lk, err
		}
		w.sleep(ctx, n, nil)
	}
}

// poll is TryAcquire (wait false: one attempt) and a blocking Acquire on a
// driver without a queue: attempts woken by release notifications (when
// the driver is a Watcher) with a bounded poll as the fallback.
func (e *Engine) poll(ctx context.Context, cfg *config, wait bool) (lk *Lock, err error) {
	w := &waiter{e: e, cfg: cfg}
	if wait {
		w.waiter = NewOwner()
	}
	var (
		sub     driver.Subscription
		watched bool
	)
	defer func() {
		if sub != nil {
			closeSub(ctx, sub)
		}
		if lk == nil {
			w.leave()
		}
	}()
	if wait && e.ready != nil && e.watcher != nil {
		if s := e.ready.Ready(cfg.key); s != nil {
			sub, watched = s, true
			if wi, ok := s.(driver.WaitIDer); ok {
				w.waitID = wi.WaitID()
			}
		}
	}
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return nil, w.ended(ctx)
		}
		lk, done, err := w.attempt(ctx, n, e.drv.Try, e.attemptGrace(), true)
		if done || !wait {
			return lk, err
		}
		if !watched && e.watcher != nil {
			watched = true
			s, err, abandoned := call(ctx, func(ctx context.Context) (driver.Subscription, error) {
				return e.watcher.Watch(ctx, cfg.key)
			}, func(s driver.Subscription, err error) {
				if err == nil && s != nil {
					s.Close()
				}
			})
			if abandoned {
				return nil, unavailable(ctx, cfg.key, w.last, nil, w.lastErr)
			}
			if err == nil && s != nil {
				sub = s
				if wi, ok := s.(driver.WaitIDer); ok {
					w.waitID = wi.WaitID()
				}
				continue // attempt again now that releases are heard
			}
		}
		var notify <-chan struct{}
		if sub != nil {
			notify = sub.C()
		}
		if !w.sleep(ctx, n, notify) {
			// A closed channel would be ready for ever: poll instead.
			closeSub(ctx, sub)
			sub = nil
		}
	}
}

// closeSub closes sub, waiting for it no longer than ctx allows: closing
// a subscription may talk to a server that is hung, and the caller must
// return by its deadline (an Acquire that got its lock must not hang in
// Close). A Close still running then finishes in the background.
func closeSub(ctx context.Context, sub driver.Subscription) {
	switch {
	case ctx.Err() != nil:
		background.Go(sub.Close)
	case ctx.Done() == nil:
		sub.Close() // nothing to return early for
	default:
		done := make(chan struct{})
		background.Go(func() {
			defer close(done)
			sub.Close()
		})
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
}

// grant turns a successful attempt into a Lock. It refuses (and undoes
// in the background) a grant with no validity left (the request took so
// long that its local deadline already passed) or lost while it was being
// handed out, with an error wrapping ErrTransient, and a malformed grant
// (a driver bug) with a plain error. A grant whose effective TTL differs
// from the request's gives the Lock its own copy of cfg with that TTL.
func (e *Engine) grant(req *driver.Request, cfg *config, g driver.Grant, start time.Time) (*Lock, error) {
	if g.Lease == nil || g.Token == 0 || g.TTL < 0 || g.TTL > MaxTTL {
		background.Go(func() { e.undo(req, g, nil) })
		return nil, fmt.Errorf("dlock: acquire %q: the %s driver granted a lease without a lease handle, with token 0 or with ttl %v", req.Key, e.spec.Name, g.TTL)
	}
	if g.TTL > 0 && g.TTL != cfg.TTL {
		c := *cfg
		c.TTL = g.TTL
		if c.Drift() >= c.TTL/2 || (c.MaxHold > 0 && c.MaxHold <= c.Drift()) {
			background.Go(func() { e.undo(req, g, nil) })
			return nil, fmt.Errorf("%w: lock %q: the server granted a %v lease, too short for the drift allowance %v", ErrInvalidTTL, req.Key, g.TTL, c.Drift())
		}
		cfg = &c
	}
	// The driver knows when the lease's current validity began: earlier
	// than the attempt (a reused lease), or later (a queued attempt whose
	// lease was kept alive while it waited). A Start in the future is
	// a driver bug and is not believed.
	now := e.wd.clk.Now()
	if !g.Start.IsZero() && !g.Start.After(now) {
		start = g.Start
	}
	if !now.Before(start.Add(cfg.TTL - cfg.Drift())) {
		background.Go(func() { e.undo(req, g, nil) })
		return nil, fmt.Errorf("%w: lock %q was granted with no validity left (the request took longer than the TTL minus the drift allowance); released", ErrTransient, req.Key)
	}
	lk := newLock(req.Key, req.Owner, cfg, g, start, e.wd)
	if err := lk.Err(); err != nil {
		return nil, fmt.Errorf("%w: lock %q was lost while it was handed out: %w", ErrTransient, req.Key, err)
	}
	return lk, nil
}

// isContextErr reports whether err is ctx's own error (or cause): the
// backend stopped because the context ended, not because it failed.
func isContextErr(err error, ctx context.Context) bool {
	return err != nil && (errors.Is(err, ctx.Err()) || errors.Is(err, context.Cause(ctx)))
}

// undo removes what an attempt may have left on the server: the lease of a
// grant nobody will use, or, when the outcome is unknown, whatever the
// backend's Abort finds for the attempt's owner. It runs in the
// background with its own bounded context.
func (e *Engine) undo(req *driver.Request, g driver.Grant, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultReleaseTimeout)
	defer cancel()
	var na *NotAcquiredError
	switch {
	case err == nil && g.Lease != nil:
		_ = g.Lease.Release(ctx)
	case err != nil && !errors.As(err, &na) && !errors.Is(err, ErrTransient):
		if e.aborter != nil {
			_ = e.aborter.Abort(ctx, req)
		}
	}
}

func notAcquired(key string, last *NotAcquiredError, cause error) error {
	e := &NotAcquiredError{Key: key, Cause: cause}
	if last != nil {
		e.Holders = last.Holders
	}
	return e
}

// unavailable reports an attempt that failed (err) or got no answer while
// ctx ended: err nil or ctx's own error, or a driver's error that wraps
// it (its own words on what went silent are kept). Nothing is known about
// the key, so it is not ErrNotAcquired even if an earlier attempt saw a
// holder. prev, if not nil, is the failure of the attempt before (the
// reason the caller was still waiting), kept as a cause. One line.
func unavailable(ctx context.Context, key string, last *NotAcquiredError, err, prev error) error {
	format, args := "%w: acquire %q: ", []any{ErrUnavailable, key}
	switch {
	case err == nil || err == ctx.Err() || err == context.Cause(ctx):
		format += "no answer before the context ended (%w)"
		args = append(args, ctxErr(ctx))
	case isContextErr(err, ctx):
		format += "no answer before the context ended (%w)"
		args = append(args, err)
	default:
		format += "%w"
		args = append(args, err)
	}
	if last != nil && len(last.Holders) > 0 {
		format += "; last seen held by %s"
		args = append(args, last.Holders[0].String())
	}
	if prev != nil {
		format += "; the attempt before failed: %w"
		args = append(args, prev)
	}
	e := fmt.Errorf(format, args...)
	if errors.Is(e, ctx.Err()) && errors.Is(e, context.Cause(ctx)) {
		return e
	}
	return fmt.Errorf("%w (the context ended: %w)", e, ctxErr(ctx))
}
