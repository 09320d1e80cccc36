package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

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
