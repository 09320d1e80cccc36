package filelock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

var (
	_ dlock.Breaker  = (*Locker)(nil)
	_ driver.Breaker = (*backend)(nil)
)

// Break implements dlock.Breaker (see dlock.Break): under the key's flock
// it removes every unexpired lease on key (owner "") or owner's alone,
// keeping the token counter and the waiting writers' registrations, and
// wakes waiters. A record this version does not understand is removed by
// a forced break only.
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.BreakResult{}, err
	}
	var res driver.BreakResult
	err := b.update(ctx, key, func(r *record, now int64) (bool, bool, error) {
		res = driver.BreakResult{}
		s := r.state(now)
		keep := s.holders[:0:0]
		for _, h := range s.holders {
			held := driver.Held{Owner: h.Owner, Token: h.Token, Metadata: maps.Clone(h.Metadata), TTL: time.Duration(h.Expires - now), Mode: s.mode}
			if owner == "" || (h.Owner == owner && !s.foreign) {
				res.Removed = append(res.Removed, held)
			} else {
				res.Others = append(res.Others, held)
				keep = append(keep, h)
			}
		}
		if len(res.Removed) == 0 {
			return false, false, nil
		}
		res.Others = nil
		// Never let the counter fall below a token that was handed out.
		r.Counter = r.maxToken()
		s.holders = slices.Clone(keep)
		if len(s.holders) == 0 {
			s.mode, s.limit, s.foreign = driver.Exclusive, 0, false
		}
		r.store(&s)
		return true, false, nil
	})
	if err != nil {
		return driver.BreakResult{}, err
	}
	if len(res.Removed) > 0 {
		b.wake(key)
	}
	return res, nil
}

// opTimeout bounds the flock wait of operations that take no context
// (Expire).
const opTimeout = 30 * time.Second

// Expire deletes key's leases (every holder's, in any mode) as if they had
// expired, behind the holders' backs (the token counter and any waiting
// writers' registrations are kept). The holders lose the lock at once if they
// have held it for more than 100 ms and are in this process or, with
// inotify, in another (see the package doc); the others at their next
// renewal. Expiring a free key does nothing; a nil *Locker, or one not
// made by New, returns an error wrapping dlock.ErrNilClient.
func (l *Locker) Expire(key string) error {
	if l == nil || l.dir == "" {
		return fmt.Errorf("%w: filelock.Locker not made by New", dlock.ErrNilClient)
	}
	if err := dlock.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	b := (*backend)(l)
	cleared := false
	err := b.update(ctx, key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		if len(s.holders) == 0 {
			return false, false, nil
		}
		s.holders, s.foreign = nil, false
		r.store(&s)
		cleared = true
		return true, false, nil
	})
	if err != nil {
		return fmt.Errorf("filelock: expire %q: %w", key, err)
	}
	if cleared {
		b.wake(key)
	}
	return nil
}
