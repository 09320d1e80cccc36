// Package memlock is an in-process dlock.Locker for unit tests and hermetic
// examples. It has the same lease semantics as the network backends (TTL,
// watchdog renewal, local deadline, fencing tokens, owner-checked release),
// but its state lives in one process: it gives no mutual exclusion between
// processes.
package memlock

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// Locker is an in-memory lock service. The zero value is not usable; call
// New. Lockers are safe for concurrent use; share one between the goroutines
// that should exclude each other.
type Locker struct {
	*dlock.Acquirer
	mu      sync.Mutex
	entries map[string]*entry
	tokens  map[string]uint64
	waiters map[string]map[chan struct{}]struct{}
}

type entry struct {
	owner   string
	token   uint64
	expires time.Time
	meta    map[string]string
}

var _ dlock.Locker = (*Locker)(nil)

// New returns an empty in-memory lock service.
func New() *Locker {
	l := &Locker{entries: map[string]*entry{}, tokens: map[string]uint64{}, waiters: map[string]map[chan struct{}]struct{}{}}
	l.Acquirer = dlock.NewAcquirer((*backend)(l), 0)
	return l
}

// Info describes a held lock.
type Info struct {
	Key      string
	Owner    string
	Token    uint64
	TTL      time.Duration
	Metadata map[string]string
}

// List returns the held locks.
func (l *Locker) List() []Info {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out []Info
	for k, e := range l.entries {
		if e.expires.After(now) {
			out = append(out, Info{Key: k, Owner: e.owner, Token: e.token, TTL: e.expires.Sub(now), Metadata: maps.Clone(e.meta)})
		}
	}
	return out
}

// Expire deletes key's lease as if it had expired, behind its holder's back.
// Tests use it to exercise loss handling: the holder notices at its next
// renewal.
func (l *Locker) Expire(key string) {
	l.mu.Lock()
	delete(l.entries, key)
	l.wakeLocked(key)
	l.mu.Unlock()
}

func (l *Locker) wakeLocked(key string) {
	for ch := range l.waiters[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// backend implements the dlock SPI on Locker's state.
type backend Locker

func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := ctx.Err(); err != nil {
		return dlock.Grant{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if e, ok := b.entries[req.Key]; ok && e.expires.After(now) {
		return dlock.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holder: e.owner, Metadata: maps.Clone(e.meta), TTL: e.expires.Sub(now)}
	}
	tok := b.tokens[req.Key] + 1
	b.tokens[req.Key] = tok
	b.entries[req.Key] = &entry{owner: req.Owner, token: tok, expires: now.Add(req.Config.TTL), meta: req.Config.Metadata}
	return dlock.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner}, Token: tok}, nil
}

func (b *backend) Watch(ctx context.Context, key string) (dlock.Subscription, error) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	if b.waiters[key] == nil {
		b.waiters[key] = map[chan struct{}]struct{}{}
	}
	b.waiters[key][ch] = struct{}{}
	b.mu.Unlock()
	return &sub{b: b, key: key, ch: ch}, nil
}

type sub struct {
	b   *backend
	key string
	ch  chan struct{}
}

func (s *sub) C() <-chan struct{} { return s.ch }
func (s *sub) Close() {
	s.b.mu.Lock()
	delete(s.b.waiters[s.key], s.ch)
	if len(s.b.waiters[s.key]) == 0 {
		delete(s.b.waiters, s.key)
	}
	s.b.mu.Unlock()
}

type lease struct {
	b          *backend
	key, owner string
}

// heldLocked returns the entry if it is still this lease's and unexpired.
func (l *lease) heldLocked() (*entry, error) {
	e, ok := l.b.entries[l.key]
	if !ok || e.owner != l.owner || !e.expires.After(time.Now()) {
		return nil, fmt.Errorf("%w: memlock key %q", dlock.ErrNotHeld, l.key)
	}
	return e, nil
}

func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	e, err := l.heldLocked()
	if err != nil {
		return err
	}
	e.expires = time.Now().Add(ttl)
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	if _, err := l.heldLocked(); err != nil {
		return err
	}
	delete(l.b.entries, l.key)
	(*Locker)(l.b).wakeLocked(l.key)
	return nil
}
