// Acquiring: Try (driver.Driver) and Queue (driver.Queuer) create an
// ephemeral sequential node under the key's znode; the holder is the node
// with the lowest sequence number.

package zklock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// exists is what an Exists or a watching read returned.
type exists struct {
	ok    bool
	stat  *zk.Stat
	watch <-chan zk.Event
	data  []byte // watchNode only
}

// watchNode reads path with a watch on it. It uses a data read, not an
// exists: an exists on a missing node leaves a watch for the node's
// creation, which for a sequential node never comes, so the watch would
// stay on the server (and be re-sent at every reconnect) for the whole
// session. A data read of a missing node sets no watch.
func watchNode(c *zk.Conn, path string) (exists, error) {
	d, st, w, err := c.GetW(path)
	if errors.Is(err, zk.ErrNoNode) {
		return exists{}, nil
	}
	if err != nil {
		return exists{}, err
	}
	return exists{ok: true, stat: st, watch: w, data: d}, nil
}

// create puts req's queue node under the key's znode (a container, created
// if missing, with the prefix above it) and returns it. A create whose
// reply was lost is found again by its protection id before it is tried
// again, so it is never orphaned nor duplicated.
func (b *backend) create(ctx context.Context, req *driver.Request) (*entry, error) {
	lease, err := b.lease()
	if err != nil {
		return nil, err
	}
	dir := b.keyPath(req.Key)
	data := encodeValue(req.Owner, req.Metadata)
	sid := b.conn.SessionID()
	recovered := false
	for attempt := 0; ; attempt++ {
		// call runs the create on a goroutine of its own: when call gives
		// up on it (the context ended, the request timed out) it may not
		// even have been sent yet, and take effect after the engine's
		// Abort listed the key and found nothing. So whichever of the
		// create and its caller comes second deletes the node.
		var (
			mu      sync.Mutex
			gaveUp  bool
			created string
		)
		path, err := call(ctx, b, "create", func() (string, error) {
			h := b.hooks.Load()
			if h != nil && h.beforeCreate != nil {
				h.beforeCreate()
			}
			p, err := b.conn.Create(dir+"/"+nodePrefix(req.Owner, req.Mode, req.Limit), data, zk.FlagEphemeralSequential, b.acl)
			mu.Lock()
			if err == nil {
				created = p
				if gaveUp {
					b.newEntry(req, dir, p[len(dir)+1:], sid, lease).abandon()
				}
			}
			mu.Unlock()
			if h != nil && h.afterCreate != nil {
				h.afterCreate(err)
			}
			return p, err
		})
		if err != nil {
			mu.Lock()
			gaveUp = true
			if created != "" {
				b.newEntry(req, dir, created[len(dir)+1:], sid, lease).abandon()
			}
			mu.Unlock()
		}
		switch {
		case err == nil:
			e := b.newEntry(req, dir, path[len(dir)+1:], sid, lease)
			e.recovered = recovered
			return e, nil
		case errors.Is(err, zk.ErrNoNode) && attempt < 5:
			if err := b.ensureDir(ctx, dir); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, zk.ErrConnectionClosed) && attempt < 5 && ctx.Err() == nil:
			// The reply was lost: the node may exist. Create again only
			// once a listing of the key's children (after the client
			// reconnects) shows it does not: never two nodes.
			name, ferr := b.findRetrying(ctx, dir, req.Owner)
			if ferr != nil {
				// The outcome stays unknown: never report it as transient
				// (nothing left behind), and delete the node whenever the
				// ensemble answers again.
				b.abandonOwner(dir, req.Owner)
				lost := fmt.Errorf("dlock: zookeeper create %q: the reply was lost (%v) and the node could not be looked up: %s", req.Key, err, ferr.Error())
				if errors.Is(ferr, dlock.ErrUnavailable) {
					return nil, dlock.Unavailable(lost) // the ensemble is still out of reach
				}
				return nil, lost
			}
			recovered = true
			if name != "" {
				e := b.newEntry(req, dir, name, b.conn.SessionID(), lease)
				e.recovered = true
				return e, nil
			}
			continue
		}
		return nil, err
	}
}

func (b *backend) newEntry(req *driver.Request, dir, name string, sid int64, lease time.Duration) *entry {
	return &entry{b: b, key: req.Key, owner: req.Owner, dir: dir, name: name, path: dir + "/" + name, sid: sid, lease: lease,
		mode: req.Mode, limit: req.Limit, md: req.Metadata}
}

// findRetrying is find, retried while the connection is being
// re-established (bounded by ctx and a few attempts).
func (b *backend) findRetrying(ctx context.Context, dir, owner string) (string, error) {
	for attempt := 0; ; attempt++ {
		name, err := b.find(ctx, dir, owner)
		if err == nil || attempt >= 10 || ctx.Err() != nil ||
			!(errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, dlock.ErrTransient)) {
			return name, err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// find returns the name of owner's queue node under dir ("" if none).
func (b *backend) find(ctx context.Context, dir, owner string) (string, error) {
	kids, err := call(ctx, b, "list", func() ([]string, error) {
		k, _, err := b.conn.Children(dir)
		return k, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, k := range kids {
		if n, ok := parseNode(k); ok && n.owner == owner {
			return k, nil
		}
	}
	return "", nil
}

// ensureDir creates the key's znode as a container (ZooKeeper deletes it
// once its last child is gone) and the prefix above it as persistent
// nodes, as far as they are missing.
func (b *backend) ensureDir(ctx context.Context, dir string) error {
	_, err := call(ctx, b, "create", func() (string, error) {
		return b.conn.CreateContainer(dir, nil, zk.FlagContainer, b.acl)
	})
	if err == nil || errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	// The prefix is missing: create it, one level at a time.
	p := ""
	for _, seg := range strings.Split(strings.TrimPrefix(b.prefix, "/"), "/") {
		p += "/" + seg
		_, err := call(ctx, b, "create", func() (string, error) {
			return b.conn.Create(p, nil, zk.FlagPersistent, b.acl)
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// look reads, at once, the key's queue and, when mine is nil, e's node
// (setting a watch on it: Bind's loss signal). It reports the queue and
// whether e's node is in it with its stat. A waiter looking again passes
// what its first look read (the node's stat and watch stay valid while
// the node is in the queue).
//
// A grant's lease counts from the look that decided it, so the look must
// show what the leader had when it was sent. The first look follows the
// create of e's node, which the leader ordered, validating the session,
// an instant before. A waiter's later look could be answered by a
// follower cut off from the leader, whose stale queue and unforwarded
// session would then start a lease the leader does not know of: it syncs
// first, so the queue it reads is the leader's as of after the look was
// sent, or it fails.
func (b *backend) look(ctx context.Context, e *entry, mine *exists) ([]qnode, exists, error) {
	kids := make(chan result[[]string], 1)
	go func() {
		if mine != nil {
			if _, err := call(ctx, b, "sync", func() (string, error) { return b.conn.Sync(e.dir) }); err != nil && !errors.Is(err, zk.ErrNoNode) {
				kids <- result[[]string]{nil, err}
				return
			}
		}
		k, err := call(ctx, b, "list", func() ([]string, error) {
			k, _, err := b.conn.Children(e.dir)
			return k, err
		})
		kids <- result[[]string]{k, err}
	}()
	var me exists
	var err error
	if mine == nil {
		me, err = call(ctx, b, "exists", func() (exists, error) {
			return watchNode(b.conn, e.path)
		})
	}
	k := <-kids
	if mine != nil && k.err == nil {
		me = *mine
		me.ok = false
		for _, c := range k.v {
			if c == e.name {
				me.ok = true
			}
		}
	}
	if err == nil {
		err = k.err
	}
	if err != nil {
		return nil, exists{}, err
	}
	q := queueOf(k.v)
	for i := 0; i < len(q); i++ {
		if n := q[i]; n.owner == e.owner && n.name != e.name {
			// Another node of this very attempt (a create that took
			// effect twice): it would wait ahead of us for ever.
			dup := &entry{b: b, key: e.key, owner: e.owner, dir: e.dir, name: n.name, path: e.dir + "/" + n.name, sid: e.sid}
			dup.abandon()
			q = append(q[:i], q[i+1:]...)
			i--
		}
	}
	return q, me, nil
}

// holderOf reads the queue node n of key (its data and creation zxid) as
// a holder; what cannot be read is left zero.
func (b *backend) holderOf(ctx context.Context, key, dir string, n qnode) dlock.Holder {
	h := dlock.Holder{Owner: n.owner, Mode: dlock.Mode(n.mode)}
	type got struct {
		data []byte
		stat *zk.Stat
	}
	g, err := call(ctx, b, "get", func() (got, error) {
		d, st, err := b.conn.Get(dir + "/" + n.name)
		return got{d, st}, err
	})
	if err == nil {
		if v := parseValue(g.data); v.Owner != "" {
			h.Owner, h.Metadata = v.Owner, v.Metadata
		}
		h.Token = uint64(g.stat.Czxid)
	}
	if h.Owner == "" {
		h.Owner = "node " + n.name
	}
	return h
}

// Try implements driver.Driver: create this attempt's node; it holds the
// lock if the recipe admits it where it stands in the queue (see
// admitted), else it is deleted again and the holders are reported.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	start := time.Now()
	e, err := b.create(ctx, req)
	if err != nil {
		return driver.Grant{}, err
	}
	q, me, err := b.look(ctx, e, nil)
	if err != nil {
		e.abandon()
		return driver.Grant{}, err
	}
	if !me.ok {
		return driver.Grant{}, fmt.Errorf("%w: zookeeper acquire %q: the new queue node vanished (session expired?)", dlock.ErrTransient, req.Key)
	}
	if i := position(q, e.name); i >= 0 && admitted(q, i) {
		g := e.grant(me, start)
		e.markIfFollowed(q, i)
		return g, nil
	}
	// The refused node goes before Try returns: left to the background,
	// it would be in the queue after the holder's release and refuse the
	// next TryAcquire, of any client, naming an owner that holds nothing.
	// The holders are read meanwhile.
	gone := e.abandonStarted()
	defer b.waitDeleted(ctx, gone)
	others := without(q, e.name)
	held := holdersOf(others)
	if err := e.mismatch(held); err != nil {
		return driver.Grant{}, err
	}
	na := &dlock.NotAcquiredError{Key: req.Key}
	for _, n := range held[:min(len(held), maxNamed)] {
		na.Holders = append(na.Holders, b.holderOf(ctx, req.Key, e.dir, n))
	}
	return driver.Grant{}, na
}

// waitDeleted waits for a deletion started by abandonStarted to end, at
// most until ctx ends or for the request timeout: past that it goes on in
// the background (see Orphans).
func (b *backend) waitDeleted(ctx context.Context, gone <-chan struct{}) {
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case <-gone:
	case <-ctx.Done():
	case <-t.C:
	}
}

// maxNamed bounds the holders a refusal reads and names (a semaphore may
// have many).
const maxNamed = 16

// position returns the index of the node name in q, -1 if it is not there.
func position(q []qnode, name string) int {
	for i := range q {
		if q[i].name == name {
			return i
		}
	}
	return -1
}

// without returns q without the node name.
func without(q []qnode, name string) []qnode {
	out := make([]qnode, 0, len(q))
	for _, n := range q {
		if n.name != name {
			out = append(out, n)
		}
	}
	return out
}

// mismatch is the error of a limited request on a key whose holders are a
// semaphore of another size (nil otherwise).
func (e *entry) mismatch(held []qnode) error {
	if e.mode != driver.Limited || len(held) == 0 || held[0].mode != driver.Limited || held[0].limit == e.limit {
		return nil
	}
	return fmt.Errorf("%w: zookeeper key %q is held as a semaphore of %d permits, not %d", dlock.ErrLimitMismatch, e.key, held[0].limit, e.limit)
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

// Wait liveness: a waiter probes its own node while it waits, so that a
// wait whose context ends can tell a held key from a silent ensemble.
const (
	// waitProbe is how often a waiter checks its node is still there
	// (which also shows ZooKeeper answering).
	waitProbe = 250 * time.Millisecond
	// waitRecency: a wait whose context ends reports the holder it waits
	// behind (ErrNotAcquired) only if ZooKeeper answered this recently;
	// otherwise it reports that ZooKeeper did not answer.
	waitRecency = time.Second
)

// Queue implements driver.Queuer: wait in key's FIFO queue until the
// recipe admits this attempt's node (see admitted), watching only the
// node whose change can let it in: the node just ahead for an exclusive
// request, the last node of another mode ahead for a shared or limited
// one, and for a permit behind permits of its own size the permit just
// ahead (which marks itself when granted) or, when it is the first one
// not admitted, the key's children (any holder's release admits it). So
// a release wakes the waiters it admits, not the herd. When ctx ends
// while ZooKeeper keeps answering it returns a *dlock.NotAcquiredError
// naming the holders; when ZooKeeper stopped answering, an error saying
// so. Either way the node is deleted in the background.
func (b *backend) Queue(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	e, err := b.create(ctx, req)
	if err != nil {
		return driver.Grant{}, err
	}
	lastOK := time.Now()
	var held []qnode
	ended := func(err error) error {
		// A writer that gave up stops keeping readers out as soon as its
		// node is gone: give the deletion a moment before answering.
		e.abandonWithin(endedDeleteWait)
		if since := time.Since(lastOK); since >= waitRecency || len(held) == 0 {
			return fmt.Errorf("dlock: zookeeper acquire %q: no answer from ZooKeeper in the last %v of the wait: %w", req.Key, since.Round(time.Millisecond), err)
		}
		return b.waitEnded(req.Key, held, context.Cause(ctx))
	}
	probe := time.NewTicker(waitProbe)
	defer probe.Stop()
	var first *exists
	seenMark := ""     // a node ahead whose granted mark made us look again
	var kept markWatch // the watch of a wait on a mark that looked again
	for {
		sent := time.Now()
		q, me, err := b.look(ctx, e, first)
		if err != nil {
			if ctx.Err() != nil {
				return driver.Grant{}, ended(err)
			}
			e.abandon()
			return driver.Grant{}, err
		}
		lastOK = sent
		if !me.ok {
			return driver.Grant{}, fmt.Errorf("%w: zookeeper acquire %q: the queue node vanished while waiting (session expired?)", dlock.ErrTransient, req.Key)
		}
		if first == nil {
			first = &me
		}
		i := position(q, e.name)
		if i < 0 { // listed before our node was visible: look again
			continue
		}
		if admitted(q, i) {
			g := e.grant(me, sent)
			e.markIfFollowed(q, i)
			return g, nil
		}
		held = holdersOf(q[:i])
		if err := e.mismatch(held); err != nil {
			e.abandon()
			return driver.Grant{}, err
		}
		sent = time.Now()
		w, onMark, pzxid, err := b.waitOn(ctx, e, q, i, &seenMark, &kept)
		if err != nil {
			if ctx.Err() != nil {
				return driver.Grant{}, ended(err)
			}
			e.abandon()
			return driver.Grant{}, err
		}
		lastOK = sent
		if w == nil {
			continue
		}
		// A permit waiting for the granted mark of the permit ahead of it
		// depends on that permit's client to write it: a frozen or dead
		// client never does, and its node, admitted but unaware of it,
		// stays until its session expires. So such a wait also looks at
		// the queue again every markRelook of its own lease, and one dead
		// waiter costs the permits behind it at most that long.
		relook := time.Now().Add(markRelook(e.lease))
	wait:
		for {
			select {
			case ev := <-w:
				b.sawWatch()
				kept = markWatch{}
				if ev.Type == zk.EventNotWatching {
					e.abandon()
					return driver.Grant{}, fmt.Errorf("%w: zookeeper acquire %q: the watch ended: %w", dlock.ErrTransient, req.Key, ev.Err)
				}
				break wait
			case <-probe.C:
				if onMark && !time.Now().Before(relook) {
					break wait
				}
				sent := time.Now()
				if pzxid != 0 {
					// A wait on the key's children probes the key's
					// node: a change of its children since the watch was
					// set means the watch missed it (see childrenMoved),
					// and our node's own deletion is such a change.
					moved, err := b.childrenMoved(ctx, e, pzxid)
					switch {
					case err != nil && ctx.Err() != nil:
						return driver.Grant{}, ended(err)
					case err != nil:
					case moved:
						lastOK = sent
						break wait
					default:
						lastOK = sent
					}
					continue
				}
				me, err := call(ctx, b, "exists", func() (exists, error) {
					ok, st, err := b.conn.Exists(e.path)
					return exists{ok: ok, stat: st}, err
				})
				switch {
				case err != nil && ctx.Err() != nil:
					return driver.Grant{}, ended(err)
				case err != nil:
					// Disconnected: the client reconnects (and re-sets
					// the watch) or the session expires; keep waiting.
				case !me.ok:
					return driver.Grant{}, fmt.Errorf("%w: zookeeper acquire %q: the queue node vanished while waiting (session expired?)", dlock.ErrTransient, req.Key)
				default:
					lastOK = sent
				}
			case <-ctx.Done():
				return driver.Grant{}, ended(context.Cause(ctx))
			}
		}
	}
}

// markRelook is how long a permit waiting for the granted mark of the
// permit ahead of it waits before looking at the queue again, for a lease
// of lease: a third of it, at least waitProbe.
func markRelook(lease time.Duration) time.Duration {
	return max(lease/3, waitProbe)
}

// waitOn sets the watch q[i], not admitted, waits on (see Queue). A nil
// watch means: look again at once (what it depends on already changed).
// onMark reports a watch on a waiting permit ahead for its granted mark;
// kept holds such a watch that has not fired, reused when the waiter
// looks again and still waits on the same node (a new watch would add a
// channel to the client's watchers of the node at every look). seenMark remembers a node ahead whose granted mark sent the waiter to
// look again, so that a mark nobody explains (a foreign write) cannot
// make it spin.
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

// waitEnded is the error of a wait whose context ended: the key was held
// by the nodes held (from the wait's last look).
func (b *backend) waitEnded(key string, held []qnode, cause error) error {
	na := &dlock.NotAcquiredError{Key: key, Cause: cause}
	for _, n := range held[:min(len(held), maxNamed)] {
		h := dlock.Holder{Owner: n.owner, Mode: dlock.Mode(n.mode)}
		if h.Owner == "" {
			h.Owner = "node " + n.name
		}
		na.Holders = append(na.Holders, h)
	}
	return na
}

// Abort implements driver.Aborter: delete req.Owner's queue node, if an
// attempt whose outcome is unknown created one.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	dir := b.keyPath(req.Key)
	err := b.deleteOwner(ctx, dir, req.Owner)
	if err != nil {
		b.abandonOwner(dir, req.Owner) // the attempt may still take effect
	}
	if h := b.hooks.Load(); h != nil && h.aborted != nil {
		h.aborted(err)
	}
	return err
}

// Orphans: a node nobody uses any more (a waiter that gave up, an attempt
// that found the key held, a lost lock whose release failed) must be
// deleted, or it holds the key for as long as the session lives, and the
// client's pings keep the session alive. So the deletion is retried in the
// background until it succeeds or the node is gone with its session.
const (
	// orphanRetryFor bounds the retries of one deletion.
	orphanRetryFor = 2 * time.Minute
	// orphanBackoff is the longest pause between two tries.
	orphanBackoff = time.Second
)

// abandon deletes e's node in the background (see Orphans). At most one
// deletion runs per node.
func (e *entry) abandon() {
	e.mu.Lock()
	if e.deleting || e.deletedByUs {
		e.mu.Unlock()
		return
	}
	e.deleting = true
	e.mu.Unlock()
	background.Go(e.deleteOrphan)
}

func (e *entry) deleteOrphan() {
	if h := e.b.hooks.Load(); h != nil && h.beforeOrphanDelete != nil {
		h.beforeOrphanDelete()
	}
	deleted := e.b.retryDelete(e.sid, func(ctx context.Context) (bool, error) {
		_, err := call(ctx, e.b, "delete", func() (struct{}, error) {
			return struct{}{}, e.b.conn.Delete(e.path, -1)
		})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, zk.ErrNoNode):
			return false, nil
		}
		return false, err
	})
	e.mu.Lock()
	if deleted || e.unsure {
		e.deletedByUs = true
	}
	e.deleting = false
	e.mu.Unlock()
}

// endedDeleteWait is how long a wait whose context ended waits for its
// node's deletion before returning (within the core's grace for a queue
// wait); the deletion goes on in the background if it takes longer.
const endedDeleteWait = 50 * time.Millisecond

// abandonStarted is abandon, returning a channel closed once the deletion
// it started ends (at once if one ran or runs already).
func (e *entry) abandonStarted() <-chan struct{} {
	done := make(chan struct{})
	e.mu.Lock()
	if e.deleting || e.deletedByUs {
		e.mu.Unlock()
		close(done)
		return done
	}
	e.deleting = true
	e.mu.Unlock()
	background.Go(func() {
		defer close(done)
		e.deleteOrphan()
	})
	return done
}

// abandonWithin is abandon, waiting up to d for the deletion to finish.
func (e *entry) abandonWithin(d time.Duration) {
	done := e.abandonStarted()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// abandonOwner deletes, in the background, every queue node of owner under
// dir: an attempt whose outcome is unknown and could not be undone at once
// (the ensemble hung or was unreachable) may still create one, and nobody
// would ever delete it (see Orphans).
func (b *backend) abandonOwner(dir, owner string) {
	sid := b.conn.SessionID()
	background.Go(func() {
		b.retryDelete(sid, func(ctx context.Context) (bool, error) {
			return false, b.deleteOwner(ctx, dir, owner)
		})
	})
}

// deleteOwner deletes every queue node of owner under dir.
func (b *backend) deleteOwner(ctx context.Context, dir, owner string) error {
	kids, err := call(ctx, b, "list", func() ([]string, error) {
		k, _, err := b.conn.Children(dir)
		return k, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range kids {
		if n, ok := parseNode(k); !ok || n.owner != owner {
			continue
		}
		_, err := call(ctx, b, "delete", func() (struct{}, error) {
			return struct{}{}, b.conn.Delete(dir+"/"+k, -1)
		})
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retryDelete runs try until it succeeds (a nil error), the session sid
// is gone (its ephemeral nodes with it), the program closed the
// connection, or orphanRetryFor passed, pausing with a growing backoff.
// It reports try's deleted result of the successful run.
func (b *backend) retryDelete(sid int64, try func(ctx context.Context) (deleted bool, err error)) bool {
	end := time.Now().Add(orphanRetryFor)
	pause := 50 * time.Millisecond
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		deleted, err := try(ctx)
		cancel()
		if err == nil {
			return deleted
		}
		if errors.Is(err, zk.ErrNoAuth) || b.conn.SessionID() != sid || b.closed() {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, orphanBackoff)
	}
	return false
}

// closed reports whether the connection was closed by the program: its
// state stays Disconnected (a client that lost its server is Connecting
// or Connected again within a moment).
func (b *backend) closed() bool {
	for i := 0; i < 3; i++ {
		if b.conn.State() != zk.StateDisconnected {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
