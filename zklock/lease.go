// The held lock: a queue node as a driver.Lease. Its validity is its
// session's: renewing proves the session alive and the node still there;
// releasing deletes the node (the key's znode, a container, is the
// server's to remove once empty).

package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// entry is one attempt's queue node.
type entry struct {
	b     *backend
	key   string
	owner string
	dir   string // the key's znode
	name  string // the node's name under dir
	path  string // dir + "/" + name
	sid   int64  // the session that created it
	lease time.Duration
	mode  driver.Mode
	limit int               // for driver.Limited
	md    map[string]string // the request's metadata (the granted mark rewrites it)
	czxid int64             // the creation zxid: the fencing token
	watch <-chan zk.Event
	// recovered: a create of this attempt lost its reply. A create still
	// in flight then may yet add a second node of the same owner, behind
	// this one; it is deleted after the release.
	recovered bool

	mu          sync.Mutex
	released    bool // a release was sent: a deletion seen from now is ours
	unsure      bool // a delete of ours was sent and its outcome is unknown
	deleting    bool // abandon's deletion is running
	deletedByUs bool
}

// grant is the Grant of e, first in its queue: the token is its creation
// zxid and the lease counts from start, the send time of a request whose
// answer showed the node (so the session) alive. The node is ephemeral:
// it goes when the client closes its session (EndsWithClient), and a dead
// client's node stays until the ensemble expires the session, up to
// LingerOf the session timeout after the client's last message.
func (e *entry) grant(me exists, start time.Time) driver.Grant {
	e.czxid, e.watch = me.stat.Czxid, me.watch
	e.sid = me.stat.EphemeralOwner // the session it lives and dies with
	return driver.Grant{Lease: e, Token: uint64(e.czxid), TTL: e.lease, Start: start,
		EndsWithClient: true, Linger: LingerOf(e.lease * leaseDen / leaseNum)}
}

func (e *entry) notHeld(why string) error {
	return fmt.Errorf("%w: zookeeper lock %q: %s", dlock.ErrNotHeld, e.key, why)
}

// check is the renewal verdict on e from a sync and an exists of its node.
func (e *entry) check(ttl time.Duration, me exists, err error) error {
	switch {
	case err != nil:
		return err
	case e.b.conn.SessionID() != e.sid:
		return e.notHeld("its session expired")
	case !me.ok || me.stat.Czxid != e.czxid:
		return e.notHeld("its node was deleted")
	}
	if l, lerr := e.b.lease(); lerr != nil || l < ttl {
		return e.notHeld(fmt.Sprintf("the session timeout was renegotiated below the lease %v", ttl))
	}
	return nil
}

// Refresh implements driver.Lease. The session is kept alive by the
// client's own pings; a renewal proves, with a sync (which the server
// forwards to the leader) and an exists of the node sent together, that
// the ensemble still has the session and the node, as of the time they
// were sent.
func (e *entry) Refresh(ctx context.Context, ttl time.Duration) error {
	var out error
	e.b.RefreshBatch(ctx, []driver.Renewal{{Lease: e, TTL: ttl}}, func(_ int, err error) { out = err })
	return out
}

// refreshWorkers bounds the exists requests one batch has in flight.
const refreshWorkers = 32

// RefreshBatch implements driver.BatchRenewer: one sync for the batch and
// an exists per node, all at once.
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	synced := make(chan error, 1)
	go func() {
		_, err := call(ctx, b, "sync", func() (string, error) { return b.conn.Sync("/") })
		synced <- err
	}()
	results := make([]error, len(rs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(refreshWorkers, len(rs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(rs) {
					return
				}
				e := rs[i].Lease.(*entry)
				me, err := call(ctx, b, "exists", func() (exists, error) {
					ok, st, err := b.conn.Exists(e.path)
					return exists{ok: ok, stat: st}, err
				})
				results[i] = e.check(rs[i].TTL, me, err)
			}
		})
	}
	wg.Wait()
	serr := <-synced
	for i := range rs {
		err := results[i]
		if serr != nil && (err == nil || !errors.Is(err, dlock.ErrNotHeld)) {
			err = serr
		}
		done(i, err)
	}
}

// Release implements driver.Lease: one delete of the node, which wakes
// the next waiter (its watch). The node's name is unique to this attempt,
// so the delete never touches another holder's node. The key's znode is
// left to the server (a container is removed once it has no children):
// deleting it here too would make the next acquisition of the same key
// recreate it, two more writes in sequence. A release
// retried after a lost reply, on the same session, counts the node's
// absence as its own deletion.
func (e *entry) Release(ctx context.Context) error {
	e.mu.Lock()
	if e.deletedByUs {
		e.mu.Unlock()
		return nil
	}
	e.released = true
	e.mu.Unlock()
	b := e.b
	_, err := call(ctx, b, fmt.Sprintf("release %q", e.key), func() (struct{}, error) {
		return struct{}{}, b.conn.Delete(e.path, -1)
	})
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.recovered && (err == nil || errors.Is(err, zk.ErrNoNode)) {
		background.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
			defer cancel()
			_ = b.Abort(ctx, &driver.Request{Key: e.key, Owner: e.owner})
		})
	}
	switch {
	case err == nil:
		e.deletedByUs = true
		return nil
	case errors.Is(err, zk.ErrNoNode):
		if e.unsure && b.conn.SessionID() == e.sid {
			e.deletedByUs = true
			return nil
		}
		if b.conn.SessionID() != e.sid {
			return e.notHeld("its session expired before the release")
		}
		return e.notHeld("its node was deleted before the release, not by a request of this lock")
	}
	e.unsure = true
	if b.conn.SessionID() == e.sid && !e.deleting {
		// Make sure the node goes, even if nobody calls Release again (a
		// lost lock's release runs once): see Orphans.
		e.deleting = true
		background.Go(e.deleteOrphan)
	}
	return err
}

// Bind implements driver.LossNotifier with the watch set on the node when
// it was granted: its deletion by anyone else, or the end of the session
// (expired, or the connection closed), closes Lost() at once.
func (e *entry) Bind(lose func(cause error)) func() {
	stop := make(chan struct{})
	w := e.watch
	if w == nil {
		return nil
	}
	go func() {
		for {
			select {
			case <-stop:
				return
			case ev, ok := <-w:
				if !ok {
					return
				}
				// An event that comes after the binding was stopped (the
				// holder's own release, which is sent only once the
				// binding stopped) is not a loss, nor an event this lock
				// heard: when both are ready, select may pick either.
				select {
				case <-stop:
					return
				default:
				}
				e.b.sawWatch()
				e.mu.Lock()
				released := e.released
				e.mu.Unlock()
				if released {
					return
				}
				switch ev.Type {
				case zk.EventNodeDeleted:
					lose(e.notHeld("its node was deleted"))
					return
				case zk.EventNotWatching:
					if errors.Is(ev.Err, zk.ErrSessionExpired) {
						lose(e.notHeld("its session expired"))
					} else {
						lose(e.notHeld(fmt.Sprintf("the connection ended: %v", ev.Err)))
					}
					return
				}
				// Data changed (someone wrote to the node): watch again.
				ctx, cancel := context.WithTimeout(context.Background(), e.b.timeout)
				me, err := call(ctx, e.b, "watch", func() (exists, error) {
					return watchNode(e.b.conn, e.path)
				})
				cancel()
				switch {
				case err != nil:
					return // renewals decide
				case !me.ok:
					lose(e.notHeld("its node was deleted"))
					return
				}
				w = me.watch
			}
		}
	}()
	forget := func() {}
	if e.b.info != nil {
		forget = e.b.info.hold(e, lose)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			forget()
		})
	}
}
