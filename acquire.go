package dlock

import (
	"context"
	"errors"
	"time"
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
type Acquirer struct {
	backend Backend
	minTTL  time.Duration
	wd      *watchdog
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

func (a *Acquirer) acquire(ctx context.Context, key string, opts []Option, wait bool) (*Lock, error) {
	if ctx == nil {
		return nil, errors.New("dlock: nil context")
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
	if q, ok := a.backend.(Queuer); ok && wait {
		req := &Request{Key: key, Owner: NewOwner(), Config: cfg}
		start := time.Now()
		g, err := q.Queue(ctx, req)
		if err == nil {
			return newLock(key, req.Owner, cfg, g, start, a.wd), nil
		}
		if errors.Is(err, ErrNotAcquired) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, notAcquired(key, nil, errors.Join(err, context.Cause(ctx)))
		}
		return nil, err
	}
	var (
		sub     Subscription
		watched bool
		waitID  string
		last    *NotAcquiredError
	)
	defer func() {
		if sub != nil {
			sub.Close()
		}
	}()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, notAcquired(key, last, context.Cause(ctx))
		}
		// A fresh owner per attempt: a backend cleaning up a failed
		// attempt in the background can never touch a later one.
		req := &Request{Key: key, Owner: NewOwner(), Config: cfg, WaitID: waitID}
		start := time.Now()
		g, err := a.backend.Try(ctx, req)
		if err == nil {
			return newLock(key, req.Owner, cfg, g, start, a.wd), nil
		}
		var na *NotAcquiredError
		if !errors.As(err, &na) {
			if ctx.Err() != nil || isTimeout(err) {
				a.abort(ctx, req) // the request may have been applied
			}
			if ctx.Err() != nil {
				return nil, notAcquired(key, last, errors.Join(err, context.Cause(ctx)))
			}
			return nil, err
		}
		last = na
		if !wait {
			return nil, err
		}
		if !watched {
			watched = true
			if w, ok := a.backend.(Watcher); ok {
				if s, err := w.Watch(ctx, key); err == nil {
					sub = s
					if wi, ok := s.(WaitIDer); ok {
						waitID = wi.WaitID()
					}
					continue // attempt again now that releases are heard
				}
			}
		}
		d := cfg.Backoff.Next(attempt)
		if na.TTL > 0 && na.TTL+time.Millisecond < d {
			d = na.TTL + time.Millisecond // the lease expires by then
		}
		var notify <-chan struct{}
		if sub != nil {
			notify = sub.C()
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-notify:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// abort undoes an attempt whose outcome is unknown, with its own short
// context when ctx is done.
func (a *Acquirer) abort(ctx context.Context, req *Request) {
	ab, ok := a.backend.(Aborter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultReleaseTimeout)
	defer cancel()
	_ = ab.Abort(ctx, req)
}

func notAcquired(key string, last *NotAcquiredError, cause error) error {
	e := &NotAcquiredError{Key: key, Cause: cause}
	if last != nil {
		e.Holder, e.Metadata, e.TTL = last.Holder, last.Metadata, last.TTL
	}
	return e
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
