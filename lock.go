package dlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// Locker acquires locks. Every backend's *Locker implements it.
type Locker interface {
	// Acquire blocks until key is held, ctx is done, WithWait elapses, or a
	// non-retryable error occurs. Waiting that ends returns an error
	// wrapping the context's error and ErrNotAcquired when the last
	// attempt saw a holder; when it saw none (an attempt that failed
	// transiently, such as a Redlock split vote, or got no answer), that
	// attempt's error instead (ErrTransient, ErrUnavailable).
	Acquire(ctx context.Context, key string, opts ...Option) (*Lock, error)
	// TryAcquire makes one attempt; a held key returns an error wrapping
	// ErrNotAcquired (a *NotAcquiredError naming the holder where known).
	TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error)
}

// state of a Lock.
const (
	stateHeld = iota
	stateLost
	stateReleased
)

// Lock is a held lock: a lease with a local deadline. It is safe for
// concurrent use. A Lock is lost when its lease cannot be shown to be valid:
// Lost() then closes and Err() says why. Lost() closes strictly before the
// local deadline passes without a successful renewal, and the local deadline
// is earlier than the server-side expiry by the drift allowance, so a holder
// that watches Lost() stops before anyone else can be granted the key
// (given bounded clock drift and no process pause between its check of
// Lost() and its action; use fencing tokens for the latter).
type Lock struct {
	key   string
	owner string
	token uint64
	cfg   lockConfig
	meta  []string // the metadata stored with the lease: key, value, ...
	// metaHostPID: the metadata also holds MetaHost and MetaPID with this
	// process's values (kept once per process, not in meta).
	metaHostPID bool
	lease       driver.Lease
	wd          *watchdog
	acquired    time.Time
	// From the grant: the lease ends with its client's session
	// (driver.Grant.EndsWithClient), and the longest a dead holder's
	// lease may outlive it (driver.Grant.Linger; zero: the TTL).
	endsWithClient bool
	linger         time.Duration

	life   context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	state    int
	err      error
	deadline time.Time
	capTimer clockTimer
	unbind   func() // from LossNotifier.Bind
	// The server-side release: at most one request in flight (flight),
	// shared by concurrent Release calls and the cleanup of a lost lock;
	// serverDone once the server no longer holds the lease for us.
	flight     *releaseFlight
	serverDone bool
	doneResult error // nil or wrapping ErrNotHeld, once serverDone
	// announced once the call that acquired the Lock has reported its
	// EventAcquire; the Lock's Events before then (a renewal or loss on
	// the watchdog's goroutine while the caller was still reporting) wait
	// in early, and the caller reports them after its EventAcquire, so
	// that an Observer never sees a Lock's loss before its acquisition.
	announced bool
	early     []Event
}

// lockConfig is what a Lock keeps of its acquisition's config: a held
// lock costs memory for as long as it is held, and a Locker may hold
// many (the metadata map alone would double a Lock's size).
type lockConfig struct {
	TTL, MaxHold, DriftMin time.Duration
	DriftFactor            float64
	mode                   Mode
	callObs                Observer
	// releaseNotBefore: the earliest a lost lock's cleanup releases the
	// server-side lease (config.releaseNotBefore); nil: at once.
	releaseNotBefore *time.Time
}

// Drift is the clock-drift allowance for the Lock's TTL (config.Drift).
func (c *lockConfig) Drift() time.Duration {
	return time.Duration(float64(c.TTL)*c.DriftFactor) + c.DriftMin
}

// metaPairs flattens md into key, value pairs, leaving out MetaHost and
// MetaPID when both have this process's values (hostPID).
func metaPairs(md map[string]string) (p []string, hostPID bool) {
	h, okh := md[MetaHost]
	q, okq := md[MetaPID]
	hostPID = okh && okq && h == hostname && q == pid
	n := len(md)
	if hostPID {
		n -= 2
	}
	if n == 0 {
		return nil, hostPID
	}
	p = make([]string, 0, 2*n)
	for k, v := range md {
		if hostPID && (k == MetaHost || k == MetaPID) {
			continue
		}
		p = append(p, k, v)
	}
	return p, hostPID
}

// releaseFlight is one server-side release in progress.
type releaseFlight struct {
	done chan struct{}
	err  error
}

// newLock wraps a granted lease. start is the monotonic time at which the
// request that began the lease's validity was sent: the local deadline
// counts from it.
func newLock(key, owner string, cfg *config, g driver.Grant, start time.Time, wd *watchdog) *Lock {
	l := &Lock{key: key, owner: owner, token: g.Token, lease: g.Lease, wd: wd, acquired: start, endsWithClient: g.EndsWithClient, linger: g.Linger,
		cfg: lockConfig{TTL: cfg.TTL, MaxHold: cfg.MaxHold, DriftMin: cfg.DriftMin, DriftFactor: cfg.DriftFactor, mode: cfg.mode, callObs: cfg.callObs, releaseNotBefore: cfg.releaseNotBefore},
	}
	l.meta, l.metaHostPID = metaPairs(cfg.Metadata)
	l.life, l.cancel = context.WithCancelCause(context.Background())
	l.deadline = l.capDeadline(start.Add(cfg.TTL - cfg.Drift()))
	if b, ok := g.Lease.(driver.LossNotifier); ok {
		stop := b.Bind(func(cause error) {
			l.lose(LossBackend, cause, !errors.Is(cause, ErrNotHeld))
		})
		l.mu.Lock()
		if l.state == stateHeld {
			l.unbind = stop
			stop = nil
		}
		l.mu.Unlock()
		if stop != nil { // lost during Bind
			stop()
		}
	}
	// The watchdog renews the lease (unless auto-refresh is off) and loses
	// the lock at its local deadline; the hold cap has a timer of its own.
	var renewAt time.Time
	if !cfg.NoAutoRefresh {
		renewAt = start.Add(cfg.TTL / 3)
	}
	l.mu.Lock()
	if l.state == stateHeld {
		if cfg.MaxHold > 0 {
			// Drift allowance included, like every deadline: a renewal
			// clipped to the cap ends the server lease at the cap.
			l.capTimer = wd.clk.AfterFunc(clockUntil(wd.clk, start.Add(cfg.MaxHold-cfg.Drift())), func() {
				l.lose(LossHoldCap, ErrHoldCapReached, true)
			})
		}
		wd.add(l, renewAt, l.deadline)
	}
	l.mu.Unlock()
	return l
}

// NewOwner returns a random 128-bit owner id in hex.
func NewOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	var h [32]byte
	hex.Encode(h[:], b[:])
	return string(h[:])
}

// errNilLock is what the methods of a nil *Lock report.
var errNilLock = fmt.Errorf("%w: nil *dlock.Lock (did Acquire fail?)", ErrNotHeld)

// closedChan is the Lost channel of a nil *Lock.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Key returns the locked key ("" for a nil *Lock).
func (l *Lock) Key() string {
	if l == nil {
		return ""
	}
	return l.key
}

// Token returns the fencing token: it increases each time the key changes
// hands. Pass it to the protected resource and have a guard check it.
func (l *Lock) Token() uint64 {
	if l == nil {
		return 0
	}
	return l.token
}

// Owner returns this holder's random 128-bit identity (hex).
func (l *Lock) Owner() string {
	if l == nil {
		return ""
	}
	return l.owner
}

// TTL returns the lease length.
func (l *Lock) TTL() time.Duration {
	if l == nil {
		return 0
	}
	return l.cfg.TTL
}

// Metadata returns a copy of the metadata stored with the lock.
func (l *Lock) Metadata() map[string]string {
	if l == nil {
		return nil
	}
	md := make(map[string]string, len(l.meta)/2+2)
	for i := 0; i+1 < len(l.meta); i += 2 {
		md[l.meta[i]] = l.meta[i+1]
	}
	if l.metaHostPID {
		md[MetaHost], md[MetaPID] = hostname, pid
	}
	return md
}

// Lost returns a channel closed once when the lock is lost or released
// (already closed for a nil *Lock). Called after the local deadline, it
// returns a closed channel, even if the watchdog's timer has not fired
// yet (a starved machine).
func (l *Lock) Lost() <-chan struct{} {
	if l == nil {
		return closedChan
	}
	l.checkDeadline()
	return l.life.Done()
}

// Err is nil while the lock is held; after that it is ErrReleased or an
// error wrapping ErrLockLost (a *LostError). A nil *Lock reports an error
// wrapping ErrNotHeld. Like Lost, it never reports a lock held past its
// local deadline.
func (l *Lock) Err() error {
	if l == nil {
		return errNilLock
	}
	l.checkDeadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline returns the local deadline: the monotonic time by which the lease
// must be renewed or the lock counts as lost. It is the start of the last
// successful acquire or renewal request + TTL - drift allowance.
func (l *Lock) Deadline() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Context returns a context derived from parent (nil means
// context.Background()) that is also cancelled, with Err() as its cause,
// when the lock is lost or released. Call cancel when done with it.
func (l *Lock) Context(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithCancelCause(parent)
	if l == nil {
		cancel(errNilLock)
		return ctx, func() {}
	}
	if l.life.Err() != nil {
		// Already lost or released: done on return, not a goroutine hop
		// later (context.AfterFunc on a done context runs in its own).
		cancel(l.Err())
		return ctx, func() {}
	}
	stop := context.AfterFunc(l.life, func() { cancel(l.Err()) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// Fence returns the lock's fencing token and owner, for guards.
func (l *Lock) Fence() Fence {
	if l == nil {
		return Fence{}
	}
	return Fence{Token: l.token, Owner: l.owner, Shared: l.cfg.mode != Exclusive}
}

// Refresh extends the lease now. With auto-refresh on the watchdog does this
// on its own; call it when auto-refresh is off. A refusal by the server
// loses the lock (error wrapping ErrLockLost); other errors, and a server
// that does not answer before ctx ends, are returned and the lock stays
// held until its local deadline.
func (l *Lock) Refresh(ctx context.Context) error {
	if l == nil {
		return errNilLock
	}
	if ctx == nil {
		return errNilContext
	}
	if err := l.Err(); err != nil {
		return err
	}
	start := l.wd.clk.Now()
	ttl, ok := l.renewTTL(start)
	if !ok {
		l.lose(LossHoldCap, ErrHoldCapReached, true)
		return l.Err()
	}
	_, err, abandoned := call(ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.lease.Refresh(ctx, ttl)
	}, nil)
	switch {
	case abandoned:
		return fmt.Errorf("%w: refresh %q: no answer before the context ended: %w", ErrUnavailable, l.key, err)
	case err == nil:
		l.wd.src.renew(l, ResultOK, nil)
		l.renewed(start, ttl)
		return l.Err()
	case errors.Is(err, ErrNotHeld):
		l.wd.src.renew(l, ResultRefused, err)
		l.lose(LossNotHeld, err, false)
		return l.Err()
	default:
		l.wd.src.renew(l, ResultError, err)
		return refreshFailed(ctx, l.key, err)
	}
}

// refreshFailed is Refresh's error for a failed request: an error that is
// the context's end (a client that gave up at the deadline itself, as
// pgx does, before the core abandoned the call) is no answer in time,
// ErrUnavailable, as an abandoned call is; any error is joined with the
// context's.
func refreshFailed(ctx context.Context, key string, err error) error {
	if isContextErr(err, ctx) {
		return fmt.Errorf("%w: refresh %q: no answer before the context ended: %w", ErrUnavailable, key, errors.Join(err, ctx.Err()))
	}
	return errors.Join(err, ctx.Err())
}

// Release gives the lock up: it stops renewal, closes Lost() and deletes the
// server-side lease only if it is still this owner's. It is safe to call
// more than once and from several goroutines at once: one request goes to
// the server and every caller gets its outcome; after a success later
// calls return nil at once; after a network error the next call retries.
// If the caller's context is already done (or nil), Release uses its own
// context bounded by DefaultReleaseTimeout so a cancelled request never
// leaves the lock held until its TTL. It returns by the context's deadline
// even when the server does not answer (ErrUnavailable); the request then
// completes in the background. When the lock had already been lost, or
// the server no longer held the lease, Release returns the loss (wrapping
// ErrLockLost): the work done under it may not have been exclusive.
// Release on a nil *Lock returns an error wrapping ErrNotHeld.
func (l *Lock) Release(ctx context.Context) error {
	if l == nil {
		return errNilLock
	}
	if ctx == nil || ctx.Err() != nil {
		if ctx == nil {
			ctx = context.Background()
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), DefaultReleaseTimeout)
		defer cancel()
	}
	l.mu.Lock()
	var unbind func()
	first := l.state == stateHeld
	if first {
		l.state = stateReleased
		l.err = ErrReleased
		unbind = l.stopLocked()
	}
	l.mu.Unlock()
	if unbind != nil {
		unbind()
	}
	err := l.releaseServer(ctx)
	if first {
		l.wd.src.released(l, err)
	}
	switch {
	case err == nil:
		return l.lostErr()
	case errors.Is(err, ErrNotHeld):
		// The lease was gone before we released it: the lock had been lost.
		// (A retried or concurrent release never gets here for a lease it
		// removed itself: backends recognise their own release.)
		l.mu.Lock()
		if l.state == stateReleased {
			l.state = stateLost
			l.err = &LostError{Key: l.key, Token: l.token, Reason: LossNotHeld, Cause: err}
		}
		e := l.err
		l.mu.Unlock()
		return e
	default:
		if lost := l.lostErr(); lost != nil {
			return errors.Join(lost, err)
		}
		return err
	}
}

// lostErr is Err() if the lock was lost, else nil.
func (l *Lock) lostErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == stateLost {
		return l.err
	}
	return nil
}

// releaseServer deletes the server-side lease (owner-checked) unless that
// is done: it joins the request in flight, or sends one. It returns nil or
// an error wrapping ErrNotHeld once the server no longer holds the lease
// for us (the first answer is kept), and any other error otherwise.
func (l *Lock) releaseServer(ctx context.Context) error {
	l.mu.Lock()
	if l.serverDone {
		l.mu.Unlock()
		return l.doneErr()
	}
	f := l.flight
	if f == nil {
		// The request belongs to no caller: it runs to its own end (at
		// least DefaultReleaseTimeout, or the caller's later deadline)
		// even if the caller that started it stops waiting, and every
		// caller waits for it the same way.
		f = &releaseFlight{done: make(chan struct{})}
		l.flight = f
		l.mu.Unlock()
		run := func() {
			end := time.Now().Add(DefaultReleaseTimeout)
			if d, ok := ctx.Deadline(); ok && d.After(end) {
				end = d
			}
			rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
			defer cancel()
			l.endFlight(f, l.lease.Release(rctx))
		}
		if ctx.Done() == nil {
			run() // nothing to return early for
		} else {
			background.Go(run)
		}
	} else {
		l.mu.Unlock()
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		select {
		case <-f.done: // both ready: the answer wins
		default:
			return fmt.Errorf("%w: release %q: no answer before the context ended (the request goes on in the background): %w", ErrUnavailable, l.key, ctxErr(ctx))
		}
	}
	if f.err != nil && !errors.Is(f.err, ErrNotHeld) {
		return errors.Join(f.err, ctx.Err())
	}
	if s, ok := l.lease.(driver.Settler); ok && f.err == nil {
		s.Settle(ctx) // within the caller's ctx; it cannot fail the release
	}
	return l.doneErr()
}

// doneResult is the first definitive answer of the server to a release:
// nil (released) or an error wrapping ErrNotHeld.
func (l *Lock) doneErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.doneResult
}

// endFlight records the outcome of the release request f.
func (l *Lock) endFlight(f *releaseFlight, err error) {
	l.mu.Lock()
	f.err = err
	if (err == nil || errors.Is(err, ErrNotHeld)) && !l.serverDone {
		l.serverDone, l.doneResult = true, err
	}
	if l.flight == f {
		l.flight = nil
	}
	l.mu.Unlock()
	close(f.done)
}

// stopLocked stops timers, leaves the watchdog and closes Lost(). l.mu
// held. It returns the backend's stop function (LossNotifier), which the
// caller runs after unlocking: a backend may call lose from it or hold its
// own mutex while calling lose.
func (l *Lock) stopLocked() (unbind func()) {
	if l.capTimer != nil {
		l.capTimer.Stop()
	}
	l.wd.remove(l)
	l.cancel(l.err)
	unbind, l.unbind = l.unbind, nil
	return unbind
}

// lose marks the lock lost. cleanup queues a best-effort server release
// (the server may still hold the lease); without it the server is known
// not to hold it.
func (l *Lock) lose(reason LossReason, cause error, cleanup bool) {
	if l.markLost(reason, cause, cleanup) {
		background.Go(l.cleanup)
	}
}

// markLost closes Lost() and reports whether a cleanup should be started
// (the watchdog starts them only after closing every expired lock's Lost()).
func (l *Lock) markLost(reason LossReason, cause error, cleanup bool) bool {
	cleanup, unbind, lost := l.markLostUnbound(reason, cause, cleanup)
	if unbind != nil {
		unbind()
	}
	if lost {
		l.reportLost()
	}
	return cleanup
}

// markLostUnbound is markLost leaving to the caller the backend's loss
// notifier to stop (unbind, nil if none) and the EventLost to report
// (lost: this call lost the lock; see reportLost): the watchdog does both
// after its losing loop, so that neither backend code nor an Observer
// runs inside it (a slow Observer there would hold up every other lock's
// Lost() behind it).
func (l *Lock) markLostUnbound(reason LossReason, cause error, cleanup bool) (bool, func(), bool) {
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return false, nil, false
	}
	l.state = stateLost
	l.err = &LostError{Key: l.key, Token: l.token, Reason: reason, Cause: cause}
	unbind := l.stopLocked()
	if !cleanup && !l.serverDone {
		l.serverDone, l.doneResult = true, cause
		if !errors.Is(cause, ErrNotHeld) {
			l.doneResult = fmt.Errorf("%w: %w", ErrNotHeld, cause)
		}
	}
	l.mu.Unlock()
	return cleanup, unbind, true
}

// reportLost reports the EventLost of a lock markLostUnbound lost.
func (l *Lock) reportLost() {
	if !l.wd.src.observed(l) {
		return
	}
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	var reason LossReason
	if le, ok := err.(*LostError); ok {
		reason = le.Reason
	}
	l.wd.src.lost(l, reason, err)
}

// cleanup releases a lost lock on the server, best effort, so the key
// frees as soon as the server is reachable rather than at expiry.
func (l *Lock) cleanup() {
	if t := l.cfg.releaseNotBefore; t != nil {
		if wait := time.Until(*t); wait > 0 {
			// RunOnce: the key stays taken for atLeastFor, lost or not
			// (the lease outlives it: its TTL and cap are at least
			// atLeastFor).
			background.AfterFunc(wait, func() { _ = l.releaseServer(context.Background()) })
			return
		}
	}
	// Already on a background goroutine: run the request here (its own
	// context is bounded by DefaultReleaseTimeout), not on another one.
	_ = l.releaseServer(context.Background())
}

// checkDeadline loses the lock now if its local deadline has passed and
// the watchdog has not got to it yet: its timer fires late on a starved
// machine (thousands of locks under -race: a contender's attempt sent
// 56ms after a holder's deadline found Lost() still open), and a holder
// that looks at Lost() or Err() must never see a lock held past its
// deadline. A goroutine already blocked on Lost() is still woken by the
// watchdog.
func (l *Lock) checkDeadline() {
	now := l.wd.clk.Now()
	l.mu.Lock()
	due := l.state == stateHeld && !now.Before(l.deadline)
	l.mu.Unlock()
	if due && l.deadlinePassed(now) {
		background.Go(l.cleanup)
	}
}

// deadlinePassed is called by the watchdog at the local deadline, with
// now the time the lock counts as lost at (the watchdog may lose a lock a
// little early when many are due at once). It closes Lost() and reports
// whether a cleanup should be started.
func (l *Lock) deadlinePassed(now time.Time) bool {
	cleanup, unbind, lost := l.deadlinePassedUnbound(now)
	if unbind != nil {
		unbind()
	}
	if lost {
		l.reportLost()
	}
	return cleanup
}

// deadlinePassedUnbound is deadlinePassed leaving the loss notifier's stop
// and the EventLost to the caller (see markLostUnbound).
func (l *Lock) deadlinePassedUnbound(now time.Time) (bool, func(), bool) {
	l.mu.Lock()
	early := now.Before(l.deadline) // a renewal moved it meanwhile
	l.mu.Unlock()
	if early {
		// A pass that counted the lock as expired left it out of its
		// next wake-up: make sure the new deadline is watched.
		l.wd.rearm(l)
		return false, nil, false
	}
	// A lease renewed only up to the hold cap ends at the cap.
	if l.cfg.MaxHold > 0 && !now.Add(l.cfg.Drift()+time.Millisecond).Before(l.acquired.Add(l.cfg.MaxHold)) {
		return l.markLostUnbound(LossHoldCap, ErrHoldCapReached, true)
	}
	return l.markLostUnbound(LossDeadline, nil, true)
}

// capDeadline bounds a local deadline by the hold cap (less the drift
// allowance): no renewal extends the server lease past the cap.
func (l *Lock) capDeadline(d time.Time) time.Time {
	if l.cfg.MaxHold > 0 {
		if c := l.acquired.Add(l.cfg.MaxHold - l.cfg.Drift()); d.After(c) {
			return c
		}
	}
	return d
}

// renewTTL is the TTL for a renewal sent at now, clipped by the hold cap.
func (l *Lock) renewTTL(now time.Time) (time.Duration, bool) {
	ttl := l.cfg.TTL
	if l.cfg.MaxHold > 0 {
		left := l.acquired.Add(l.cfg.MaxHold).Sub(now)
		if left < time.Millisecond {
			return 0, false
		}
		if left < ttl {
			ttl = left.Truncate(time.Millisecond)
		}
	}
	return ttl, true
}

// renewed moves the local deadline after a renewal sent at start
// succeeded, and reports whether the lock is still held. A success that
// arrives after the local deadline passed does not revive the lock: the
// deadline is a promise to the holder, who may already have stopped.
func (l *Lock) renewed(start time.Time, ttl time.Duration) bool {
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return false
	}
	if now := l.wd.clk.Now(); !now.Before(l.deadline) {
		l.mu.Unlock()
		if l.deadlinePassed(now) {
			background.Go(l.cleanup)
		}
		return false
	}
	d := l.capDeadline(start.Add(ttl - l.cfg.Drift()))
	if d.After(l.deadline) {
		l.deadline = d
		l.wd.setDeadline(l, d)
	}
	l.mu.Unlock()
	return true
}
