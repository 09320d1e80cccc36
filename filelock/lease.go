// The held lock: one holder's entry in its key's record, renewed and
// released under the record's flock, and told of a break (Bind).

package filelock

import (
	"context"
	"fmt"
	"slices"
	"sync"
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
// break of one is detected by its release or renewal.
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, its lease joins the Locker's watch of its key (see
// heldWatch), which reads the key's record whenever a Break or Expire
// through any Locker of this process on the directory, or, with inotify,
// any process's write of the record, touches the key, and once when the
// watch begins (a break before it). When the record no longer lists this
// owner as a live holder, the Lock is lost at once (wrapping
// dlock.ErrNotHeld), not at its next renewal. Without inotify
// (WithInotify(false), or a system other than Linux) a break by another
// process is detected by the next renewal. stop never waits.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	bd := &binding{l: l, lose: lose}
	t := time.AfterFunc(breakListenDelay, func() { l.b.held.add(bd) })
	return func() {
		t.Stop()
		l.b.held.remove(bd)
	}
}

// heldWatch is a Locker's watch of the keys its locks hold for longer
// than breakListenDelay: one subscription to the key's wake-ups (without
// polling) and one goroutine per key, however many of the Locker's
// holders share it, each wake-up costing one read of the record that
// answers for all of them.
type heldWatch struct {
	mu   sync.Mutex
	keys map[string]*heldKey
}

// heldKey is the watch of one key.
type heldKey struct {
	leases map[*binding]struct{}
	kick   chan struct{} // a check is due (buffered, sent without blocking)
	cancel context.CancelFunc
}

// binding is one lock's place in the watch.
type binding struct {
	l       *lease
	lose    func(cause error)
	stopped bool // the lock ended: never (re)joins; h.mu
}

func (h *heldWatch) add(bd *binding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if bd.stopped {
		return
	}
	if h.keys == nil {
		h.keys = map[string]*heldKey{}
	}
	k := h.keys[bd.l.key]
	if k == nil {
		ctx, cancel := context.WithCancel(context.Background())
		k = &heldKey{leases: map[*binding]struct{}{}, kick: make(chan struct{}, 1), cancel: cancel}
		h.keys[bd.l.key] = k
		// Not background work: it lasts as long as the key is held.
		go h.watch(ctx, bd.l.b, bd.l.key, k)
	}
	k.leases[bd] = struct{}{}
	select {
	case k.kick <- struct{}{}: // a break before the lock joined
	default:
	}
}

func (h *heldWatch) remove(bd *binding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	bd.stopped = true
	k := h.keys[bd.l.key]
	if k == nil {
		return
	}
	if _, ok := k.leases[bd]; !ok {
		return
	}
	delete(k.leases, bd)
	if len(k.leases) == 0 {
		delete(h.keys, bd.l.key)
		k.cancel()
	}
}

// watch checks key's holders in k on each of its wake-ups until ctx ends.
func (h *heldWatch) watch(ctx context.Context, b *backend, key string, k *heldKey) {
	s := &subscription{dir: b.dir, id: fileID(key), notify: b.opts.inotify, ch: make(chan struct{}, 1)}
	wakeups.add(s)
	defer s.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.C():
		case <-k.kick:
		}
		// Only the holders that joined before the read are judged by it:
		// one granted later is not in the record read.
		h.mu.Lock()
		judged := make([]*binding, 0, len(k.leases))
		for bd := range k.leases {
			judged = append(judged, bd)
		}
		h.mu.Unlock()
		r, err := readRecord(b.recordPath(fileID(key)), key)
		if err != nil {
			continue // an unreadable record decides nothing: renewals report it
		}
		st := r.state(time.Now().UnixNano())
		var lost []*binding
		for _, bd := range judged {
			if st.foreign || st.find(bd.l.owner) < 0 {
				lost = append(lost, bd)
			}
		}
		for _, bd := range lost {
			// The core ignores a loss reported after the lock ended.
			bd.lose(fmt.Errorf("%w (broken, or expired)", notHeld(key)))
		}
		// Wake-ups meanwhile (every holder's renewal is one, through
		// inotify) come to one check after the pause.
		t := time.NewTimer(heldCheckPause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// heldCheckPause is the least time between two reads of a held key's
// record: a key shared by many holders is renewed many times a second,
// and each renewal wakes its watch.
const heldCheckPause = 50 * time.Millisecond
