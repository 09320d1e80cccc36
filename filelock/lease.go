// The held lock: one holder's entry in its key's record, renewed and
// released under the record's flock, and told of a break (Bind).

package filelock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// releaseOwner is compare-and-delete: it removes owner's lease on key if
// it is held unexpired, keeping the counter and the other holders, and
// wakes waiters.
func (b *backend) releaseOwner(ctx context.Context, key, owner string) error {
	err := b.update(ctx, key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		i := s.find(owner)
		if i < 0 || s.foreign {
			return false, false, notHeld(key)
		}
		s.holders = slices.Delete(s.holders, i, i+1)
		r.store(&s)
		return true, false, nil
	})
	if err == nil {
		b.wake(key)
	}
	return err
}

func notHeld(key string) error {
	return fmt.Errorf("%w: filelock key %q", dlock.ErrNotHeld, key)
}

// lease is one granted acquisition: one holder of the key, in any mode.
type lease struct {
	b          *backend
	key, owner string
}

// Refresh implements driver.Lease: compare-and-expire under the flock, of
// this holder's lease alone.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return l.b.update(ctx, l.key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		i := s.find(l.owner)
		if i < 0 || s.foreign {
			return false, false, notHeld(l.key)
		}
		s.holders[i].Expires = now + int64(ttl)
		r.store(&s)
		return true, false, nil
	})
}

// Release implements driver.Lease.
func (l *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return l.b.releaseOwner(ctx, l.key, l.owner)
}

var _ driver.LossNotifier = (*lease)(nil)

// breakListenDelay is how long a lock is held before it listens for
// breaks. Most locks are held for less: they cost no subscription, and a
// break of one is found by its release or renewal.
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, the lease subscribes to its key's wake-ups (see
// watch.go: a Break or Expire through any Locker of this process on the
// directory, and, with inotify, any process's write of the key's record),
// and on each reads the record once, without its flock (records are
// replaced atomically): when it no longer lists this owner as a live
// holder, the Lock is lost at once (wrapping dlock.ErrNotHeld), not at
// its next renewal. It also reads once when it subscribes, which covers
// a break before that. The subscription does not poll: without inotify
// (WithInotify(false), or a system other than Linux) a break by another
// process is found by the next renewal. stop cancels the listening
// without waiting.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	// Not background work: it lasts as long as the lock.
	t := time.AfterFunc(breakListenDelay, func() { go l.listenBreaks(ctx, lose) })
	return func() {
		t.Stop()
		cancel()
	}
}

// listenBreaks is Bind's listener, until ctx ends or the lock is lost.
func (l *lease) listenBreaks(ctx context.Context, lose func(cause error)) {
	s := &subscription{dir: l.b.dir, id: fileID(l.key), notify: l.b.opts.inotify, ch: make(chan struct{}, 1)}
	wakeups.add(s)
	defer s.Close()
	s.fire() // a break before the subscription
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.C():
		}
		if live, err := l.live(); err == nil && !live {
			lose(fmt.Errorf("%w (broken, or expired)", notHeld(l.key)))
			return
		}
		// An unreadable record decides nothing: the renewal reports it.
	}
}

// live reports whether the key's record lists this owner as a live
// holder, read without the record's flock.
func (l *lease) live() (bool, error) {
	r, err := readRecord(l.b.recordPath(fileID(l.key)), l.key)
	if err != nil {
		return false, err
	}
	s := r.state(time.Now().UnixNano())
	return s.find(l.owner) >= 0 && !s.foreign, nil
}
