package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

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
