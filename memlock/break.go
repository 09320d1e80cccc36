package memlock

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

var (
	_ dlock.Breaker  = (*Locker)(nil)
	_ driver.Breaker = (*state)(nil)
)

// Break implements dlock.Breaker (see dlock.Break): it removes every lease
// on key (owner "") or owner's alone, closes the Lost() of the Locks that
// held them (LossBackend, wrapping dlock.ErrNotHeld) before it returns,
// and wakes the key's waiters.
// Waiting-writer registrations stay.
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (s *state) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.BreakResult{}, err
	}
	var tell []func(error)
	defer func() { // outside s.mu: lose stops the binding, which takes it
		for _, lose := range tell {
			lose(fmt.Errorf("%w: memlock key %q was broken (dlock.Break)", dlock.ErrNotHeld, key))
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	var res driver.BreakResult
	ks := s.keys[key]
	if ks == nil {
		return res, nil
	}
	now := time.Now()
	for _, h := range ks.live(now) {
		held := driver.Held{Owner: h.owner, Token: h.token, Metadata: maps.Clone(h.meta), TTL: h.expires.Sub(now), Mode: ks.mode}
		if owner == "" || h.owner == owner {
			delete(ks.holders, h.owner)
			if h.lose != nil {
				tell = append(tell, h.lose)
			}
			res.Removed = append(res.Removed, held)
		} else {
			res.Others = append(res.Others, held)
		}
	}
	if len(res.Removed) > 0 {
		res.Others = nil
		s.wakeLocked(key)
	}
	return res, nil
}

// Expire deletes every lease on key as if it had expired, behind the
// holders' backs. Tests use it to exercise loss handling: a holder notices
// at its next renewal. A nil *Locker, or one not made by New, does nothing.
func (l *Locker) Expire(key string) {
	if l == nil || l.s == nil {
		return
	}
	s := l.s
	s.mu.Lock()
	if ks := s.keys[key]; ks != nil {
		clear(ks.holders)
	}
	s.wakeLocked(key)
	s.mu.Unlock()
}
