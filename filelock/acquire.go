package filelock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Try implements driver.Driver. The decision is keyState.decide, made
// under the record's flock; a refusal that writes nothing is answered from
// an unlocked read first.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	// The attempt's start bounds a waiting writer's registration: it
	// lapses no later than one TTL after the attempt.
	start := time.Now().UnixNano()
	id := fileID(req.Key)
	wpath := b.writersPath(id)
	// Fast path for waiters: a held lease seen in an (atomically replaced)
	// record, and a registration seen fresh, are valid answers without
	// contending for the flock.
	if r, err := readRecord(b.recordPath(id), req.Key); err == nil {
		now := time.Now().UnixNano()
		s := r.state(now)
		if needsWriters(req) {
			s.withWriters(readWriters(wpath, req.Key), now)
		}
		if out, _, err := s.decide(req.Key, req, now, start); out == refuse {
			return driver.Grant{}, err
		}
	}
	var token uint64
	err := b.update(ctx, req.Key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		if needsWriters(req) {
			s.withWriters(readWriters(wpath, req.Key), now)
		}
		out, have, err := s.decide(req.Key, req, now, start)
		switch out {
		case grantHave:
			token = have
			return false, false, nil
		case refuse:
			return false, false, err
		case register:
			w := writerRec{Waiter: req.Waiter, Expires: start + int64(req.TTL)}
			if i := s.findWriter(req.Waiter); i >= 0 {
				s.writers[i] = w
			} else {
				s.writers = append(s.writers, w)
			}
			// Registrations are advisory: one that cannot be written costs
			// this writer its preference, never its exclusive lock.
			_ = writeWriters(wpath, req.Key, s.writers)
			return false, false, err
		}
		next := r.maxToken()
		if next == math.MaxUint64 {
			return false, false, fmt.Errorf("filelock: key %q: fencing tokens exhausted", req.Key)
		}
		token = next + 1
		if len(s.holders) == 0 {
			s.mode, s.limit = req.Mode, 0
			if req.Mode == driver.Limited {
				s.limit = req.Limit
			}
		}
		s.holders = append(s.holders, holderRec{Owner: req.Owner, Token: token, Expires: now + int64(req.TTL), Metadata: req.Metadata})
		if needsWriters(req) && s.removeWriter(req.Waiter) {
			// Granted: no longer waiting. Should the record's write below
			// fail, the writer registers again at its next attempt; should
			// this one fail, the registration lapses within a TTL, keeping
			// out meanwhile only readers, who could not have the key while
			// the writer holds it anyway.
			_ = writeWriters(wpath, req.Key, s.writers)
		}
		r.store(&s)
		r.Counter = token
		// The counter grew: make the rename durable so no token is ever
		// issued twice, even across a power loss.
		return true, true, nil
	})
	if err != nil {
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) && token != 0 {
			// The write may have landed (e.g. only the directory fsync
			// failed): take the lease back so it does not linger to its TTL.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlock.DefaultReleaseTimeout)
			_ = b.releaseOwner(cctx, req.Key, req.Owner)
			cancel()
		}
		return driver.Grant{}, err
	}
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner}, Token: token}, nil
}

// Abort implements driver.Aborter: it removes owner's lease if one was
// granted.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	if err := b.releaseOwner(ctx, req.Key, req.Owner); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return err
	}
	return nil
}

// Leave implements driver.Leaver: it removes waiter's registration as a
// waiting writer of key, if there is one, and wakes the process's waiters
// (readers kept out by it may now proceed; other processes' are woken by
// inotify or their poll).
func (b *backend) Leave(ctx context.Context, key, waiter string) error {
	if waiter == "" || dlock.ValidateKey(key) != nil {
		return nil // never registered
	}
	wpath := b.writersPath(fileID(key))
	if !slices.ContainsFunc(readWriters(wpath, key), func(w writerRec) bool { return w.Waiter == waiter }) {
		// Not registered: registrations are made under the flock by the
		// waiter's own attempts, and its Acquire has ended.
		return nil
	}
	removed := false
	err := b.update(ctx, key, func(_ *record, now int64) (bool, bool, error) {
		var s keyState
		s.withWriters(readWriters(wpath, key), now)
		if !s.removeWriter(waiter) {
			return false, false, nil
		}
		removed = true
		return false, false, writeWriters(wpath, key, s.writers)
	})
	if removed {
		b.wake(key)
	}
	return err
}
