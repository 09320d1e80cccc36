// Release notification: what a waiter watches so that a release wakes the
// waiters it admits and not the herd, the granted mark a permit writes for
// the permit waiting behind it, and the probe that catches a children
// watch missed across a reconnect.

package zklock

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// waitOn sets the watch q[i], not admitted, waits on (see Queue). A nil
// watch means: look again at once (what it depends on already changed).
// onMark reports a watch on a waiting permit ahead for its granted mark;
// kept holds such a watch that has not fired, reused when the waiter
// looks again and still waits on the same node (a new watch would add a
// channel to the client's watchers of the node at every look). seenMark
// remembers a node ahead whose granted mark sent the waiter to look
// again, so that a mark nobody explains (a foreign write) cannot make it
// spin.
func (b *backend) waitOn(ctx context.Context, e *entry, q []qnode, i int, seenMark *string, kept *markWatch) (_ <-chan zk.Event, onMark bool, pzxid int64, _ error) {
	j := blocker(q, i)
	if j < 0 && i == q[i].limit {
		// The first permit not admitted: any holder's release admits it.
		type kids struct {
			names []string
			pzxid int64
			watch <-chan zk.Event
		}
		k, err := call(ctx, b, "watch", func() (kids, error) {
			names, st, w, err := b.conn.ChildrenW(e.dir)
			if err != nil {
				return kids{}, err
			}
			return kids{names, st.Pzxid, w}, nil
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil, false, 0, nil
		}
		if err != nil {
			return nil, false, 0, err
		}
		nq := queueOf(k.names)
		if ni := position(nq, e.name); ni < 0 || admitted(nq, ni) {
			return nil, false, 0, nil
		}
		w := k.watch
		if h := b.hooks.Load(); h != nil && h.childWatch != nil {
			w = h.childWatch(w)
		}
		return w, false, k.pzxid, nil
	}
	if j < 0 {
		j, onMark = i-1, true // a permit behind waiting permits of its size
	}
	dep := q[j]
	if onMark && kept.w != nil && kept.name == dep.name {
		return kept.w, true, 0, nil
	}
	*kept = markWatch{}
	w, err := call(ctx, b, "watch", func() (exists, error) {
		return watchNode(b.conn, e.dir+"/"+dep.name)
	})
	if err != nil {
		return nil, false, 0, err
	}
	if !w.ok {
		return nil, false, 0, nil
	}
	if dep.mode == driver.Limited && parseValue(w.data).Granted && *seenMark != dep.name {
		*seenMark = dep.name
		return nil, false, 0, nil
	}
	if onMark {
		*kept = markWatch{name: dep.name, w: w.watch}
	}
	return w.watch, onMark, 0, nil
}

// childrenMoved reports whether the children of e's key node changed since
// its stat said pzxid. A children watch can miss a change made while the
// client was disconnected: go-zookeeper re-sets its watches on reconnect
// relative to the last zxid it saw, and may take that zxid from a reply
// the new connection already received, one newer than the change (a data
// watch cannot miss a deletion: one on a missing node always fires). A
// missing key node counts as a change.
func (b *backend) childrenMoved(ctx context.Context, e *entry, pzxid int64) (bool, error) {
	st, err := call(ctx, b, "exists", func() (exists, error) {
		ok, st, err := b.conn.Exists(e.dir)
		return exists{ok: ok, stat: st}, err
	})
	if err != nil {
		return false, err
	}
	return !st.ok || st.stat.Pzxid != pzxid, nil
}

// markWatch is a permit's unfired watch on the waiting permit ahead of it.
type markWatch struct {
	name string
	w    <-chan zk.Event
}

// markRelook is how long a permit waiting for the granted mark of the
// permit ahead of it waits before looking at the queue again, for a lease
// of lease: a third of it, at least waitProbe.
func markRelook(lease time.Duration) time.Duration {
	return max(lease/3, waitProbe)
}

// markIfFollowed writes the granted mark into e's node, in the background,
// when e is a limited node granted with nodes queued behind it: a permit
// waiting behind a waiting permit watches only that node, and needs to
// hear when it is granted (see Queue). A listing that shows nothing behind
// e shows that no node behind it saw e waiting (positions only move
// forward), so no write is needed.
func (e *entry) markIfFollowed(q []qnode, i int) {
	if e.mode != driver.Limited || i >= len(q)-1 {
		return
	}
	data := encodeGranted(e.owner, e.md)
	background.Go(func() {
		for attempt := 0; attempt < 5; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
			_, err := call(ctx, e.b, "mark", func() (*zk.Stat, error) {
				return e.b.conn.Set(e.path, data, -1)
			})
			cancel()
			if err == nil || errors.Is(err, zk.ErrNoNode) || e.b.conn.SessionID() != e.sid {
				return
			}
			time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
		}
	})
}

// sawWatch counts a watch event one of b's waiters or holders received
// (tests: a release must wake one waiter, not the herd).
func (b *backend) sawWatch() { b.watchEvents.Add(1) }
