package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/background"
)

// Backend is the service-provider interface a lock service implements to
// get the common acquire loop, watchdog and Lock handle through Acquirer.
type Backend interface {
	// Try makes one attempt to take req.Key for req.Owner. When the key is
	// held it returns a *NotAcquiredError (with the holder and the time
	// left on its lease where known). Any other error ends Acquire.
	Try(ctx context.Context, req *Request) (Grant, error)
}

// Request is one acquisition attempt.
type Request struct {
	Key    string
	Owner  string
	Config *Config
	// WaitID identifies a waiting Acquire across its attempts, once its
	// subscription has one (see WaitIDer); empty otherwise. A backend may
	// queue it so that a release wakes this waiter alone.
	WaitID string
}

// WaitIDer is implemented by subscriptions that name their waiter: the
// backend wakes waiters one at a time by that id, and Acquire passes it to
// every later attempt in Request.WaitID.
type WaitIDer interface {
	WaitID() string
}

// Watcher is implemented by backends that can notify waiters of a release.
// Acquire subscribes before its next attempt, so a release that happens
// between the attempt and the wait still wakes it.
type Watcher interface {
	// Watch starts listening for releases of key. The returned
	// subscription's channel receives (without blocking the sender) when the
	// key may have become free. An error makes Acquire fall back to polling.
	Watch(ctx context.Context, key string) (Subscription, error)
}

// Subscription is a live interest in a key's release.
type Subscription interface {
	C() <-chan struct{}
	Close()
}

// Queuer is implemented by backends with a server-side FIFO queue (etcd,
// ZooKeeper). A blocking Acquire calls Queue instead of polling Try: the
// backend enqueues req and waits for its turn itself, watching only its
// predecessor, and removes its queue entry if ctx ends first (returning the
// context's error or a *NotAcquiredError). TryAcquire still uses Try.
type Queuer interface {
	Queue(ctx context.Context, req *Request) (Grant, error)
}

// Aborter is implemented by backends that can undo an attempt whose outcome
// is unknown (the reply was lost or the context ended mid-request): it
// removes req.Owner's lease on req.Key if one was granted.
type Aborter interface {
	Abort(ctx context.Context, req *Request) error
}

// Acquirer implements Locker on top of a Backend: argument checks, the wait
// loop (notification plus bounded polling), the Lock handle and the shared
// watchdog. Backends embed or wrap one.
//
// Every backend call the Acquirer makes on behalf of a caller returns by
// the caller's context, whatever the backend's client does with it: a call
// still running at the deadline is abandoned (and undone in the background
// if it turns out to have taken effect).
type Acquirer struct {
	backend Backend
	minTTL  time.Duration
	wd      *watchdog
	rtt     atomic.Int64 // moving average of answered attempts, ns
}

// Bounds of the grace an attempt in flight gets once its context ends.
const (
	minAttemptGrace = 5 * time.Millisecond
	maxAttemptGrace = 100 * time.Millisecond
)

// observe feeds an answered attempt's duration into the moving average.
func (a *Acquirer) observe(d time.Duration) {
	old := a.rtt.Load()
	if old == 0 {
		a.rtt.Store(int64(d))
		return
	}
	a.rtt.Store(old + (int64(d)-old)/8) // approximate under races: fine
}

// attemptGrace is how long an attempt still in flight when its context
// ends may take to answer before it is abandoned: four recent round trips,
// within [5ms, 100ms]. A healthy server answers within it, so a wait that
// ends mid-attempt reports what the server said (the holder, or the lock);
// a hung one is reported unavailable that much after the deadline.
func (a *Acquirer) attemptGrace() time.Duration {
	return min(max(4*time.Duration(a.rtt.Load()), minAttemptGrace), maxAttemptGrace)
}

var _ Locker = (*Acquirer)(nil)

// NewAcquirer returns an Acquirer over b. Leases are renewed in batches when
// b implements BatchRenewer. minTTL is the backend's minimum TTL (0 means
// MinTTL).
func NewAcquirer(b Backend, minTTL time.Duration) *Acquirer {
	br, _ := b.(BatchRenewer)
	return &Acquirer{backend: b, minTTL: minTTL, wd: newWatchdog(br)}
}

// Renewing reports how many locks the watchdog is keeping alive.
func (a *Acquirer) Renewing() int { return a.wd.held() }

// Acquire implements Locker.
func (a *Acquirer) Acquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return a.acquire(ctx, key, opts, true)
}

// TryAcquire implements Locker.
func (a *Acquirer) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return a.acquire(ctx, key, opts, false)
}

// errNilContext is returned for a nil context.
var errNilContext = fmt.Errorf("%w: nil context", ErrInvalidOption)

func (a *Acquirer) acquire(ctx context.Context, key string, opts []Option, wait bool) (*Lock, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	cfg, err := NewConfig(key, a.minTTL, opts...)
	if err != nil {
		return nil, err
	}
	if wait && cfg.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Wait)
		defer cancel()
	}
	attemptFn := a.backend.Try
	q, queued := a.backend.(Queuer)
	if queued = queued && wait; queued {
		attemptFn = q.Queue
	}
	var (
		sub     Subscription
		watched bool
		waitID  string
		last    *NotAcquiredError // the holder seen by the last attempt, if it saw one
		lastErr error             // the last transient failure, if the last attempt failed so
	)
	defer func() {
		switch {
		case sub == nil:
		case ctx.Err() != nil:
			// The server may be hung: unsubscribing must not hold the
			// caller past its deadline.
			background.Go(sub.Close)
		default:
			sub.Close()
		}
	}()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			switch {
			case last != nil:
				return nil, notAcquired(key, last, context.Cause(ctx))
			case lastErr != nil:
				return nil, errors.Join(lastErr, context.Cause(ctx))
			}
			return nil, fmt.Errorf("dlock: acquire %q: %w", key, context.Cause(ctx))
		}
		// A fresh owner per attempt: a backend cleaning up a failed
		// attempt in the background can never touch a later one.
		req := &Request{Key: key, Owner: NewOwner(), Config: cfg, WaitID: waitID}
		start := time.Now()
		grace := a.attemptGrace()
		if queued {
			grace = queueGrace
		}
		g, err, abandoned := callGrace(ctx, grace, func(ctx context.Context) (Grant, error) {
			return attemptFn(ctx, req)
		}, func(g Grant, err error) { a.undo(req, g, err) })
		if abandoned {
			return nil, unavailable(key, last, nil, err)
		}
		if !queued && ctx.Err() == nil {
			a.observe(time.Since(start))
		}
		if err == nil {
			var lk *Lock
			if lk, err = a.grant(req, g, start); err == nil {
				return lk, nil
			}
		}
		var na *NotAcquiredError
		switch {
		case last != nil && ctx.Err() != nil && isContextErr(err, ctx):
			// The attempt stopped because the wait ended (the backend gave
			// up on the context it was handed, promptly): the key was
			// seen held and nothing says otherwise.
			return nil, notAcquired(key, last, context.Cause(ctx))
		case errors.As(err, &na):
			last, lastErr = na, nil
			if !wait || queued { // a queue returns it only when ctx ended
				return nil, err
			}
		case errors.Is(err, ErrTransient):
			last, lastErr = nil, err
			if !wait {
				return nil, err
			}
		default:
			// The outcome is unknown (a reset connection, a timeout, the
			// context ending mid-request): undo it in the background.
			background.Go(func() { a.undo(req, Grant{}, err) })
			if ctx.Err() != nil {
				return nil, unavailable(key, last, err, context.Cause(ctx))
			}
			return nil, err
		}
		if !watched && !queued {
			watched = true
			if w, ok := a.backend.(Watcher); ok {
				s, err, abandoned := call(ctx, func(ctx context.Context) (Subscription, error) {
					return w.Watch(ctx, key)
				}, func(s Subscription, err error) {
					if err == nil && s != nil {
						s.Close()
					}
				})
				if abandoned {
					return nil, unavailable(key, last, nil, err)
				}
				if err == nil && s != nil {
					sub = s
					if wi, ok := s.(WaitIDer); ok {
						waitID = wi.WaitID()
					}
					continue // attempt again now that releases are heard
				}
			}
		}
		d := cfg.Backoff.Next(attempt)
		if d <= 0 {
			d = time.Millisecond // a Backoff returning ≤ 0 must not spin
		}
		if last != nil && last.TTL > 0 && last.TTL+time.Millisecond < d {
			d = last.TTL + time.Millisecond // the lease expires by then
		}
		var notify <-chan struct{}
		if sub != nil {
			notify = sub.C()
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case _, ok := <-notify:
			t.Stop()
			if !ok {
				// A closed channel would be ready for ever: poll instead.
				sub.Close()
				sub = nil
			}
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// grant turns a successful attempt into a Lock. It refuses (and undoes
// in the background) a grant with no validity left (the request took so
// long that its local deadline already passed) or lost while it was being
// handed out, with an error wrapping ErrTransient, and a malformed grant
// (a backend bug) with a plain error.
func (a *Acquirer) grant(req *Request, g Grant, start time.Time) (*Lock, error) {
	if g.Lease == nil || g.Token == 0 {
		background.Go(func() { a.undo(req, g, nil) })
		return nil, fmt.Errorf("dlock: acquire %q: the backend granted a lease without a lease handle or with token 0", req.Key)
	}
	if !g.Start.IsZero() && g.Start.Before(start) {
		start = g.Start
	}
	if !time.Now().Before(start.Add(req.Config.TTL - req.Config.Drift())) {
		background.Go(func() { a.undo(req, g, nil) })
		return nil, fmt.Errorf("%w: lock %q was granted with no validity left (the request took longer than the TTL minus the drift allowance); released", ErrTransient, req.Key)
	}
	lk := newLock(req.Key, req.Owner, req.Config, g, start, a.wd)
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
func (a *Acquirer) undo(req *Request, g Grant, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultReleaseTimeout)
	defer cancel()
	var na *NotAcquiredError
	switch {
	case err == nil && g.Lease != nil:
		_ = g.Lease.Release(ctx)
	case err != nil && !errors.As(err, &na) && !errors.Is(err, ErrTransient):
		if ab, ok := a.backend.(Aborter); ok {
			_ = ab.Abort(ctx, req)
		}
	}
}

func notAcquired(key string, last *NotAcquiredError, cause error) error {
	e := &NotAcquiredError{Key: key, Cause: cause}
	if last != nil {
		e.Holder, e.Metadata, e.TTL = last.Holder, last.Metadata, last.TTL
	}
	return e
}

// unavailable reports an attempt that got no answer (err nil) or failed
// (err) while the context ended: nothing is known about the key, so it is
// not ErrNotAcquired even if an earlier attempt saw a holder.
func unavailable(key string, last *NotAcquiredError, err, cause error) error {
	seen := ""
	if last != nil {
		seen = "; last seen held by " + HolderString(last.Holder, last.Metadata)
	}
	var e error
	if err != nil {
		e = fmt.Errorf("%w: acquire %q: %w%s", ErrUnavailable, key, err, seen)
	} else {
		e = fmt.Errorf("%w: acquire %q: no answer before the context ended%s", ErrUnavailable, key, seen)
	}
	return errors.Join(e, cause)
}
