package memlock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

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
