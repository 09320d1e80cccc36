// Package memlock is an in-process dlock.Locker for unit tests and hermetic
// examples, and the reference backend: read it first to see how a backend
// plugs into package dlock/driver. It has the same lease semantics as the
// network backends (TTL, watchdog renewal, local deadline, fencing tokens,
// owner-checked release, release notifications) and offers every mode:
// exclusive, shared (dlock.WithShared) and counted (dlock.WithLimit).
//
// Guarantees: within one Locker, at most one exclusive holder per key, or
// any number of shared holders, or at most N holders of a key locked with
// WithLimit(N); tokens strictly increase per key for as long as the Locker
// exists, in every mode.
//
// Writers have preference (driver: Writer preference): once an exclusive
// Acquire waits for a key, new shared requests are refused until it has
// the key or gives up, so overlapping readers cannot starve it.
//
// Not guaranteed: anything between processes (the state lives in one
// process), and FIFO order: a release wakes every waiter of the key and
// the first attempt to arrive wins.
package memlock

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Option configures a Locker. memlock has no options of its own; it
// accepts the core's (dlock.WithObserver).
type Option = driver.Option

// Locker is an in-memory lock service. The zero value is not usable; call
// New. Lockers are safe for concurrent use; share one between the goroutines
// that should exclude each other.
type Locker struct {
	e *dlock.Engine
	s *state
}

var (
	_ dlock.Locker  = (*Locker)(nil)
	_ dlock.Lister  = (*Locker)(nil)
	_ driver.Leaver = (*state)(nil)
)

// New returns an empty in-memory lock service.
func New(opts ...Option) *Locker {
	s := &state{keys: map[string]*keyState{}, waiters: map[string]map[chan struct{}]struct{}{}, writers: map[string]map[string]time.Time{}}
	return &Locker{e: dlock.NewEngine(s, opts...), s: s}
}

// Acquire implements dlock.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.TryAcquire(ctx, key, opts...)
}

// List implements dlock.Lister: the held keys under prefix, sorted.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	if err := l.e.Check(ctx); err != nil {
		return nil, err
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []dlock.Info
	for k, ks := range s.keys {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		hs := ks.live(now)
		if len(hs) == 0 {
			continue
		}
		info := dlock.Info{Key: k, Mode: dlock.Mode(ks.mode), Limit: ks.limit, Waiters: len(s.waiters[k])}
		for _, h := range hs {
			info.Holders = append(info.Holders, h.public(ks.mode, now))
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// Expire deletes every lease on key as if it had expired, behind the
// holders' backs. Tests use it to exercise loss handling: a holder notices
// at its next renewal.
func (l *Locker) Expire(key string) {
	s := l.s
	s.mu.Lock()
	if ks := s.keys[key]; ks != nil {
		clear(ks.holders)
	}
	s.wakeLocked(key)
	s.mu.Unlock()
}

// state is the lock service: it implements driver.Driver and
// driver.Watcher.
type state struct {
	mu      sync.Mutex
	keys    map[string]*keyState
	waiters map[string]map[chan struct{}]struct{}
	// writers are the waiting exclusive Acquires of each key, by
	// Request.Waiter, with the expiry of their registration.
	writers map[string]map[string]time.Time
}

// keyState is one key: its holders (all of one mode) and its token
// counter, kept after the holders leave so tokens never repeat.
type keyState struct {
	token   uint64
	mode    driver.Mode
	limit   int
	holders map[string]*holder // by owner
}

type holder struct {
	owner   string
	token   uint64
	expires time.Time
	since   time.Time // acquisition
	meta    map[string]string
	// lose tells the Lock holding this lease that Break removed it
	// (driver.LossNotifier); nil before Bind and after its stop.
	lose func(cause error)
}

func (h *holder) public(m driver.Mode, now time.Time) dlock.Holder {
	return dlock.Holder{Owner: h.owner, Token: h.token, Metadata: maps.Clone(h.meta), TTL: h.expires.Sub(now), Mode: dlock.Mode(m), HeldFor: now.Sub(h.since)}
}

// live drops expired holders and returns the others, oldest first.
func (ks *keyState) live(now time.Time) []*holder {
	var hs []*holder
	for o, h := range ks.holders {
		if !h.expires.After(now) {
			delete(ks.holders, o)
			continue
		}
		hs = append(hs, h)
	}
	slices.SortFunc(hs, func(a, b *holder) int { return cmp.Compare(a.token, b.token) })
	return hs
}

func (s *state) Spec() driver.Spec {
	return driver.Spec{Name: "memory", Shared: true, Limited: true}
}

// Try implements driver.Driver.
func (s *state) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	ks := s.keys[req.Key]
	if ks == nil {
		ks = &keyState{holders: map[string]*holder{}}
		s.keys[req.Key] = ks
	}
	hs := ks.live(now)
	if h, ok := ks.holders[req.Owner]; ok { // a retry of a granted attempt
		return driver.Grant{Lease: &lease{s: s, key: req.Key, owner: req.Owner}, Token: h.token}, nil
	}
	if req.Mode == driver.Shared && s.writerWaitingLocked(req.Key, now) {
		na := &dlock.NotAcquiredError{Key: req.Key}
		for _, h := range hs {
			na.Holders = append(na.Holders, h.public(ks.mode, now))
		}
		if len(hs) == 0 || ks.mode != driver.Exclusive {
			// Name the waiting writer that keeps this reader out: no owner,
			// its registration's time left.
			na.Holders = append(na.Holders, dlock.Holder{Mode: dlock.Exclusive, TTL: s.writerLeftLocked(req.Key, now)})
		}
		return driver.Grant{}, na
	}
	if len(hs) > 0 {
		switch {
		case req.Mode == driver.Limited && ks.mode == driver.Limited && ks.limit != req.Limit:
			return driver.Grant{}, fmt.Errorf("%w: memlock key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, req.Key, ks.limit, req.Limit)
		case req.Mode != ks.mode, req.Mode == driver.Exclusive,
			req.Mode == driver.Limited && len(hs) >= ks.limit:
			na := &dlock.NotAcquiredError{Key: req.Key}
			for _, h := range hs {
				na.Holders = append(na.Holders, h.public(ks.mode, now))
			}
			if req.Mode == driver.Exclusive && req.Waiter != "" {
				if s.writers[req.Key] == nil {
					s.writers[req.Key] = map[string]time.Time{}
				}
				s.writers[req.Key][req.Waiter] = now.Add(req.TTL)
			}
			return driver.Grant{}, na
		}
	}
	if req.Waiter != "" {
		s.dropWriterLocked(req.Key, req.Waiter)
	}
	ks.token++
	ks.mode, ks.limit = req.Mode, req.Limit
	ks.holders[req.Owner] = &holder{owner: req.Owner, token: ks.token, expires: now.Add(req.TTL), since: now, meta: req.Metadata}
	return driver.Grant{Lease: &lease{s: s, key: req.Key, owner: req.Owner}, Token: ks.token}, nil
}

// writerWaitingLocked reports whether an exclusive Acquire waits for key,
// dropping expired registrations.
func (s *state) writerWaitingLocked(key string, now time.Time) bool {
	for id, exp := range s.writers[key] {
		if !exp.After(now) {
			delete(s.writers[key], id)
		}
	}
	if len(s.writers[key]) == 0 {
		delete(s.writers, key)
		return false
	}
	return true
}

// writerLeftLocked is the time left on key's longest writer registration.
func (s *state) writerLeftLocked(key string, now time.Time) time.Duration {
	var left time.Duration
	for _, exp := range s.writers[key] {
		left = max(left, exp.Sub(now))
	}
	return left
}

func (s *state) dropWriterLocked(key, waiter string) {
	if _, ok := s.writers[key][waiter]; ok {
		delete(s.writers[key], waiter)
		if len(s.writers[key]) == 0 {
			delete(s.writers, key)
		}
		s.wakeLocked(key) // readers held back by this writer may go
	}
}

// Leave implements driver.Leaver: the waiting writer gave up.
func (s *state) Leave(ctx context.Context, key, waiter string) error {
	s.mu.Lock()
	s.dropWriterLocked(key, waiter)
	s.mu.Unlock()
	return nil
}

// Watch implements driver.Watcher.
func (s *state) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.waiters[key] == nil {
		s.waiters[key] = map[chan struct{}]struct{}{}
	}
	s.waiters[key][ch] = struct{}{}
	s.mu.Unlock()
	return &sub{s: s, key: key, ch: ch}, nil
}

func (s *state) wakeLocked(key string) {
	for ch := range s.waiters[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

type sub struct {
	s   *state
	key string
	ch  chan struct{}
}

func (u *sub) C() <-chan struct{} { return u.ch }

func (u *sub) Close() {
	u.s.mu.Lock()
	delete(u.s.waiters[u.key], u.ch)
	if len(u.s.waiters[u.key]) == 0 {
		delete(u.s.waiters, u.key)
	}
	u.s.mu.Unlock()
}

// lease is one holder's lease: driver.Lease and driver.LossNotifier.
type lease struct {
	s          *state
	key, owner string
}

var _ driver.LossNotifier = (*lease)(nil)

// Bind implements driver.LossNotifier: Break calls lose at once for the
// leases it removes.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	h, err := l.heldLocked()
	if err != nil {
		return nil // the watchdog's next renewal reports it
	}
	h.lose = lose
	return func() {
		l.s.mu.Lock()
		h.lose = nil
		l.s.mu.Unlock()
	}
}

// heldLocked returns the holder if it is still this lease's and unexpired.
func (l *lease) heldLocked() (*holder, error) {
	if ks := l.s.keys[l.key]; ks != nil {
		if h, ok := ks.holders[l.owner]; ok && h.expires.After(time.Now()) {
			return h, nil
		}
	}
	return nil, fmt.Errorf("%w: memlock key %q", dlock.ErrNotHeld, l.key)
}

func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	h, err := l.heldLocked()
	if err != nil {
		return err
	}
	h.expires = time.Now().Add(ttl)
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if _, err := l.heldLocked(); err != nil {
		return err
	}
	delete(l.s.keys[l.key].holders, l.owner)
	l.s.wakeLocked(l.key)
	return nil
}
