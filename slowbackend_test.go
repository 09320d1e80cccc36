package dlock_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"

	"github.com/dlock-go/dlock"
)

// store is an in-memory lock service shared by the clients of one test.
// Leases expire at processing time + TTL, as on a server.
type store struct {
	mu       sync.Mutex
	entries  map[string]storeEntry
	tokens   map[string]uint64
	released map[string]bool // owners that released
}

type storeEntry struct {
	owner   string
	token   uint64
	expires time.Time
}

func newStore() *store {
	return &store{entries: map[string]storeEntry{}, tokens: map[string]uint64{}, released: map[string]bool{}}
}

// holder returns key's owner, or "" when free.
func (s *store) holder(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[key]; ok && time.Now().Before(e.expires) {
		return e.owner
	}
	return ""
}

// slowClient is one client of a store whose calls can be made to hang,
// ignoring their contexts, the way a default go-redis client waits on a
// stalled link until its own read timeout. It exists to test the core's
// timing without a network; backends are tested against real servers.
type slowClient struct {
	st *store

	mu    sync.Mutex
	gates map[string]chan struct{} // "op" or "op:key" -> closed when the hang ends
	// holdFirst, when set for an op, makes only the next call of that op
	// hang (until its gate closes).
	calls map[string]int
}

func newSlowClient(st *store) *slowClient {
	return &slowClient{st: st, gates: map[string]chan struct{}{}, calls: map[string]int{}}
}

// hang makes calls of op ("try", "refresh", "release"; "op:key" for one
// key) block until the returned function is called.
func (c *slowClient) hang(op string) (resume func()) {
	g := make(chan struct{})
	c.mu.Lock()
	c.gates[op] = g
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			delete(c.gates, op)
			c.mu.Unlock()
			close(g)
		})
	}
}

func (c *slowClient) gate(op, key string) {
	c.mu.Lock()
	c.calls[op]++
	g := c.gates[op+":"+key]
	if g == nil {
		g = c.gates[op]
	}
	c.mu.Unlock()
	if g != nil {
		<-g // deliberately ignores the context
	}
}

func (c *slowClient) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

func (c *slowClient) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	c.gate("try", req.Key)
	s := c.st
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if e, ok := s.entries[req.Key]; ok && now.Before(e.expires) {
		if e.owner == req.Owner { // a retried request: the lease it already has
			return driver.Grant{Lease: &slowLease{c: c, key: req.Key, owner: req.Owner, token: e.token}, Token: e.token}, nil
		}
		return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{{Owner: e.owner, TTL: e.expires.Sub(now)}}}
	}
	s.tokens[req.Key]++
	tok := s.tokens[req.Key]
	s.entries[req.Key] = storeEntry{owner: req.Owner, token: tok, expires: now.Add(req.TTL)}
	return driver.Grant{Lease: &slowLease{c: c, key: req.Key, owner: req.Owner, token: tok}, Token: tok}, nil
}

func (c *slowClient) Abort(ctx context.Context, req *driver.Request) error {
	s := c.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.entries[req.Key]; ok && e.owner == req.Owner {
		delete(s.entries, req.Key)
	}
	return nil
}

type slowLease struct {
	c          *slowClient
	key, owner string
	token      uint64
}

func (l *slowLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.c.gate("refresh", l.key)
	s := l.c.st
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[l.key]
	if !ok || e.owner != l.owner || !time.Now().Before(e.expires) {
		return fmt.Errorf("%w: %q", dlock.ErrNotHeld, l.key)
	}
	e.expires = time.Now().Add(ttl)
	s.entries[l.key] = e
	return nil
}

func (l *slowLease) Release(ctx context.Context) error {
	l.c.gate("release", l.key)
	s := l.c.st
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[l.key]
	if ok && e.owner == l.owner && time.Now().Before(e.expires) {
		delete(s.entries, l.key)
		s.released[l.owner] = true
		return nil
	}
	if s.released[l.owner] {
		return nil // a retried release
	}
	return fmt.Errorf("%w: %q", dlock.ErrNotHeld, l.key)
}

func (*slowClient) Spec() driver.Spec { return driver.Spec{Name: "test"} }
