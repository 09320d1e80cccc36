package memlock

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Option configures a Locker. memlock has no options of its own; it
// accepts the core's (dlock.WithObserver).
type Option = dlock.LockerOption

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
	return l.engine().Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().TryAcquire(ctx, key, opts...)
}

// engine is l's Engine, nil for a nil *Locker: every call of a nil *Locker
// then fails with an error wrapping dlock.ErrNilClient instead of panicking.
func (l *Locker) engine() *dlock.Engine {
	if l == nil {
		return nil
	}
	return l.e
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
