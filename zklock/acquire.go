// Acquiring: Try (driver.Driver) and Queue (driver.Queuer) create an
// ephemeral sequential node under the key's znode, and the recipe
// (modes.go) decides from the queue's order whether it holds the key;
// Abort (driver.Aborter) undoes an attempt whose outcome is unknown.

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
)

// exists is what an Exists or a watching read returned.
type exists struct {
	ok    bool
	stat  *zk.Stat
	watch <-chan zk.Event
	data  []byte // watchNode only

	// dials counts the client's connections before the watching read
	// was sent (known: dialsOK), to tell whether a later request went
	// over the connection that set the watch.
	dials   int64
	dialsOK bool
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
// session would then start a lease the leader does not know of: it sends
// a sync with the listing, and fails unless the sync succeeds, which
// shows the session alive at the leader after the look was sent.
// Whichever of the two the server answers first, the listing is never
// newer than the leader's queue, and an older queue can only have more
// nodes ahead of e's (sequence numbers only grow; nodes ahead only go),
// so it admits e only where the leader's queue does too. The deletion of
// e's own node before the sync reaches the client as a watch event
// before the sync's reply, as long as the watch was set on the server
// that answers the sync: a fired watch counts as the node gone. After a
// reconnect (or on a connection Connect did not make, whose reconnects
// zklock cannot see) the watch may be re-registered only after the sync
// is answered, so the listing is read again after the sync. A permit
// syncs first instead: the nodes behind it decide whether it marks
// itself granted, and a listing older than the sync could miss them.
func (b *backend) look(ctx context.Context, e *entry, mine *exists) ([]qnode, exists, error) {
	together := mine != nil && e.mode != driver.Limited && mine.dialsOK
	kids := make(chan result[[]string], 1)
	go func() {
		if mine != nil && !together {
			if err := b.sync(ctx, e.dir); err != nil {
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
	switch {
	case mine == nil:
		dials, dialsOK := b.dials()
		me, err = call(ctx, b, "exists", func() (exists, error) {
			return watchNode(b.conn, e.path)
		})
		me.dials, me.dialsOK = dials, dialsOK
	case together:
		err = b.sync(ctx, e.dir)
	}
	k := <-kids
	if together && err == nil && k.err == nil {
		if d, _ := b.dials(); d != mine.dials {
			// Reconnected since the watch was set: list again, after
			// the sync.
			k.v, k.err = call(ctx, b, "list", func() ([]string, error) {
				k, _, err := b.conn.Children(e.dir)
				return k, err
			})
		}
	}
	if mine != nil && k.err == nil && err == nil {
		me = *mine
		me.ok = false
		if len(mine.watch) == 0 {
			for _, c := range k.v {
				if c == e.name {
					me.ok = true
				}
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

// sync asks the server to catch up with the leader on dir (a key whose
// znode the server reaper removed syncs fine: ErrNoNode is no failure).
func (b *backend) sync(ctx context.Context, dir string) error {
	_, err := call(ctx, b, "sync", func() (string, error) { return b.conn.Sync(dir) })
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
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

// endedDeleteWait is how long a wait whose context ended waits for its
// node's deletion before returning (within the core's grace for a queue
// wait); the deletion goes on in the background if it takes longer.
const endedDeleteWait = 50 * time.Millisecond

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
			e.abandon() // a watch that fired for another reason leaves the node
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
