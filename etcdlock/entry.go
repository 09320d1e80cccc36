// Queue entries: one attempt's place (its etcd key) in a lock's queue, and
// its life as live, orphan or gone, which holds and then frees its
// session's slot for the lock.

package etcdlock

import (
	"fmt"

	"github.com/dlock-go/dlock"
)

// entry states.
const (
	entryLive   = iota // a lock, a waiter or an attempt in progress
	entryOrphan        // nobody uses it; it may exist on the server: delete it
	entryGone          // known deleted (or its lease is gone): slot freed
)

// entry is one attempt's place in a key's queue.
type entry struct {
	b     *backend
	s     *session
	key   string // the lock name
	myKey string // "<prefix><EscapeKey(KEY)>/<lease hex>"
	val   string // the value put (owner and metadata)
	owner string
	rev   int64 // create revision, the fencing token; 0 while unknown

	// guarded by b.mu
	state       int
	released    bool // a release of ours was sent (its outcome may be unknown)
	deletedByUs bool // a request of ours is known to have deleted it
	stopped     bool // Bind's stop was called: a delete seen from now may be ours
}

// goneLocked records that e is deleted on the server. It reports whether
// e's session must now be revoked. b.mu held.
func (b *backend) goneLocked(e *entry) bool {
	switch e.state {
	case entryGone:
		return false
	case entryLive:
		e.s.live--
	case entryOrphan:
		delete(b.orphans, e)
	}
	e.state = entryGone
	if e.s.slots[e.key] == e {
		delete(e.s.slots, e.key)
	}
	return b.revokeDueLocked(e.s)
}

// orphanLocked records that e is no longer used but may exist on the
// server; retire also stops new entries on its session. It reports
// whether the session must now be revoked. b.mu held.
func (b *backend) orphanLocked(e *entry, retire bool) bool {
	if retire {
		e.s.retired = true
	}
	switch e.state {
	case entryGone:
		return b.revokeDueLocked(e.s)
	case entryLive:
		e.s.live--
	}
	e.state = entryOrphan
	b.orphans[e] = struct{}{}
	return b.revokeDueLocked(e.s)
}

// gone, orphan: goneLocked and orphanLocked, revoking if due.
func (b *backend) gone(e *entry) {
	b.mu.Lock()
	r := b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
}

// goneUnlessReleased is gone for an entry found missing by a request that
// may have raced with its release: a release that was sent settles the
// entry itself (if its reply is lost, from the receipt), and until then
// the entry must keep its slot and its session must not be revoked, which
// would delete the receipt.
func (b *backend) goneUnlessReleased(e *entry) {
	b.mu.Lock()
	r := !e.released && b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
}

func (b *backend) orphan(e *entry, retire bool) {
	b.mu.Lock()
	r := b.orphanLocked(e, retire)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
}

// unknown records an attempt whose create request has an unknown outcome
// (the reply was lost, or the context ended mid-request): its entry may
// exist now or appear later. It becomes an orphan deleted by value, and its
// session is retired: revoked once no live entry is left, which deletes a
// late-created entry too.
func (b *backend) unknown(e *entry) { b.orphan(e, true) }

func (e *entry) notHeld(why string) error {
	return fmt.Errorf("%w: etcd key %s (revision %d): %s", dlock.ErrNotHeld, e.myKey, e.rev, why)
}
