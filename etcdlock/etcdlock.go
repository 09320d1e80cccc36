package etcdlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
)

// Defaults.
const (
	// DefaultPrefix is empty: lock KEY lives under "KEY/", exactly where
	// `etcdctl lock KEY` and concurrency.NewMutex(s, "KEY") put it (for
	// keys without '/' or '%'; see the package documentation).
	DefaultPrefix = ""
	// MinTTL is the shortest lease this backend accepts. etcd leases are
	// whole seconds and the server enforces its own minimum (1.5 × the
	// election timeout, 2s by default): the server-side lease may be longer
	// than the TTL, never shorter.
	MinTTL = dlock.MinTTL
	// DefaultRequestTimeout bounds each request to etcd (the etcd client
	// otherwise waits for a connection for as long as the context allows,
	// so an unreachable cluster would look like a held lock).
	DefaultRequestTimeout = 5 * time.Second
	// maxTxnOps is etcd's default limit of operations per transaction.
	maxTxnOps = 128
	// waitProbe is how often a waiter checks its place in the queue (and
	// so that etcd answers) while it watches the entry ahead of it.
	waitProbe = 250 * time.Millisecond
	// waitRecency: a wait whose context ends reports the holder it waits
	// behind (ErrNotAcquired) only if etcd confirmed that holder this
	// recently; otherwise it reports that etcd did not answer.
	waitRecency = time.Second
	// watchDelay is how long a held lock waits before it watches its own
	// entry: a lock released sooner costs no watch.
	watchDelay = 20 * time.Millisecond
	// maxRewatch bounds how often the watch on a held lock's entry is
	// re-established (after a compaction or a cancelled watch).
	maxRewatch = 1000
	// receiptDir is the directory, under the Locker's prefix, of release
	// receipts: "<prefix>\x00dlock-released/<lease hex>/<create revision>".
	// dlock keys cannot contain NUL, so no queue directory
	// "<prefix><EscapeKey(KEY)>/" is, or is inside, this directory.
	receiptDir = "\x00dlock-released/"
	// maxSpentOps bounds the deletes of spent receipts that one
	// transaction carries along.
	maxSpentOps = 32
)

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix         string
	requestTimeout time.Duration
}

// WithPrefix puts every lock under prefix (default DefaultPrefix): lock KEY
// then lives under "<prefix>KEY/". Use the same prefix as the etcdctl or
// concurrency.Mutex users it must exclude.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithRequestTimeout bounds each request to etcd (default
// DefaultRequestTimeout), within the caller's context.
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// Locker is a lock service on an etcd cluster. It never closes the client.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

type backend struct {
	client  *clientv3.Client
	prefix  string
	timeout time.Duration

	mu       sync.Mutex
	sessions map[int64][]*session // by requested lease TTL in seconds
	orphans  map[*entry]struct{}  // entries whose delete is pending
	spent    map[string]struct{}  // receipts no release will ask for: delete them
}

// New returns a Locker on client. A nil client gives a Locker whose every
// call fails with dlock.ErrNilClient.
func New(client *clientv3.Client, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.requestTimeout <= 0 {
		o.requestTimeout = DefaultRequestTimeout
	}
	b := &backend{client: client, prefix: o.prefix, timeout: o.requestTimeout,
		sessions: map[int64][]*session{}, orphans: map[*entry]struct{}{}, spent: map[string]struct{}{}}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

// errNilContext is returned by the entry points that take a context (List
// and the Guard's methods) for a nil one, like dlock's Acquire does.
var errNilContext = fmt.Errorf("%w: etcdlock: nil context", dlock.ErrInvalidOption)

// rpc bounds one request by the request timeout.
func (b *backend) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

func (b *backend) check() error {
	if b.client == nil {
		return fmt.Errorf("%w: etcdlock.New was given a nil etcd client", dlock.ErrNilClient)
	}
	return nil
}

// EscapeKey is the name of key's queue directory: key with every '%'
// replaced by "%25" and every '/' by "%2F". Keys without those characters
// are unchanged. The encoding is injective and no encoded name contains
// '/', so the directory of one dlock key never holds another dlock key's
// entries. etcdctl and concurrency.Mutex do not escape: a lock of theirs
// named EscapeKey(key), or EscapeKey(key) + "/...", shares or lies inside
// key's directory (see the package documentation).
func EscapeKey(key string) string {
	if !strings.ContainsAny(key, "/%") {
		return key
	}
	var sb strings.Builder
	sb.Grow(len(key) + 8)
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			sb.WriteString("%25")
		case '/':
			sb.WriteString("%2F")
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// unescapeKey inverts EscapeKey. It is lenient: a '%' not followed by 25
// or 2F (a name that etcdctl or a concurrency.Mutex chose) stays as it is.
func unescapeKey(name string) string {
	if !strings.Contains(name, "%") {
		return name
	}
	var sb strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] == '%' && i+3 <= len(name) {
			switch name[i+1 : i+3] {
			case "25":
				sb.WriteByte('%')
				i += 2
				continue
			case "2F":
				sb.WriteByte('/')
				i += 2
				continue
			}
		}
		sb.WriteByte(name[i])
	}
	return sb.String()
}

// QueuePrefix is the etcd key prefix under which key's queue lives:
// "<prefix><EscapeKey(key)>/" (for example to inspect it with etcdctl).
func (l *Locker) QueuePrefix(key string) string { return l.b.queuePrefix(key) }

func (b *backend) queuePrefix(key string) string { return b.prefix + EscapeKey(key) + "/" }

// session is a lease shared by the locks and waiters of one Locker that
// ask for the same lease TTL (in whole seconds), like a
// concurrency.Session. A session has at most one entry per key (its slot
// for that key), so two locks on one key taken through one Locker have
// different leases, and so different queue keys, and exclude each other.
//
// A slot is freed only once its entry is known to be deleted: an entry
// whose delete failed (or whose creation has an unknown outcome) keeps
// its slot as an orphan until a later delete succeeds, so no later lock
// can ever be handed the same entry, and its delete is retried with the
// session's next keep-alive and before the next attempt on that key.
type session struct {
	id  clientv3.LeaseID
	ttl time.Duration // as granted by the server (≥ the TTL asked for)

	// guarded by backend.mu
	slots     map[string]*entry // key → this lease's entry for key (live or orphan)
	live      int               // entries in slots that are live
	validFrom time.Time         // start of the last successful grant or keep-alive
	dead      bool              // expired, revoked or forgotten
	retired   bool              // takes no new entry; revoked once none is live
	revoking  bool
}

func leaseSeconds(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

// validity returns the start from which a lock of ttl on s counts, at now,
// without a round trip, if s is fresh enough. The server holds the lease
// until at least validFrom + s.ttl: a lock taken now may count from now if
// its whole ttl fits in that; otherwise it counts from validFrom, if that
// leaves it at least 2/3 of its ttl. Freshness is judged against the lock's
// own ttl, never the lease's (etcd raises short leases to its minimum).
// s.mu (backend.mu) held.
func (s *session) validity(ttl time.Duration, now time.Time) (time.Time, bool) {
	if !now.Add(ttl).After(s.validFrom.Add(s.ttl)) {
		return now, true
	}
	if now.Sub(s.validFrom) < ttl/3 {
		return s.validFrom, true
	}
	return time.Time{}, false
}

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

// receiptKey is the key that a release (or the retried delete of a
// released entry) puts, on the entry's lease, in the same transaction as
// its delete by create revision: "<prefix>\x00dlock-released/<lease
// hex>/<create revision>". Its presence proves that a request of ours
// deleted the entry while it was still ours.
func (e *entry) receiptKey() string {
	return e.b.prefix + receiptDir + strconv.FormatInt(int64(e.s.id), 16) + "/" + strconv.FormatInt(e.rev, 10)
}

// isReceipt reports whether k (a full etcd key) is a release receipt, of
// this Locker's prefix or any other.
func isReceipt(k string) bool { return strings.Contains(k, receiptDir) }

// takeSpentLocked returns up to maxSpentOps deletes of spent receipts,
// removing them from the set; a caller whose request fails gives them
// back. A receipt becomes spent only together with its entry's
// deletedByUs, so a caller that saw deletedByUs unset for an entry in the
// same hold of b.mu never deletes the receipt it puts. b.mu held.
func (b *backend) takeSpentLocked() []clientv3.Op {
	if len(b.spent) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, 0, min(len(b.spent), maxSpentOps))
	for k := range b.spent {
		if len(ops) == maxSpentOps {
			break
		}
		delete(b.spent, k)
		ops = append(ops, clientv3.OpDelete(k))
	}
	return ops
}

// giveBackSpent returns the deletes of a failed request to the set.
func (b *backend) giveBackSpent(ops []clientv3.Op) {
	if len(ops) == 0 {
		return
	}
	b.mu.Lock()
	for _, op := range ops {
		b.spent[string(op.KeyBytes())] = struct{}{}
	}
	b.mu.Unlock()
}

// attachLocked creates an entry for req on s, taking s's slot for the key.
// b.mu held.
func (b *backend) attachLocked(s *session, req *dlock.Request, val string) *entry {
	e := &entry{b: b, s: s, key: req.Key, owner: req.Owner, val: val,
		myKey: b.queuePrefix(req.Key) + strconv.FormatInt(int64(s.id), 16)}
	s.slots[req.Key] = e
	s.live++
	return e
}

// pickLocked returns a usable session for key among those asking for sec
// seconds, forgetting the ones that are gone. b.mu held.
func (b *backend) pickLocked(key string, sec int64, now time.Time) *session {
	list := b.sessions[sec]
	keep := list[:0]
	var s *session
	for _, c := range list {
		if c.dead || (c.live == 0 && !c.revoking && !now.Before(c.validFrom.Add(c.ttl))) {
			b.forgetLocked(c) // expired on the server by now, or revoked
			continue
		}
		keep = append(keep, c)
		if s == nil && !c.retired && c.slots[key] == nil {
			s = c
		}
	}
	clear(list[len(keep):])
	b.sessions[sec] = keep
	return s
}

// forgetLocked drops s: its lease is gone, and so are its entries. b.mu held.
func (b *backend) forgetLocked(s *session) {
	s.dead = true
	for _, e := range s.slots {
		b.goneLocked(e)
	}
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

func (b *backend) revokeDueLocked(s *session) bool {
	if s.retired && s.live == 0 && !s.dead && !s.revoking {
		s.revoking = true
		return true
	}
	return false
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

// revoke revokes a retired session's lease in the background.
//
// The revoke would delete the receipts of releases whose outcome is still
// unknown (a reply lost), and with them the proof that a retried release
// needs. Those entries are first deleted by create revision (which writes
// their receipt and reads any earlier one, settling each release); if that
// fails, the lease is not revoked but left to expire.
func (b *backend) revoke(s *session) {
	background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		defer cancel()
		b.mu.Lock()
		var unsettled []*entry
		for _, e := range s.slots {
			if e.state == entryOrphan && e.released && !e.deletedByUs {
				unsettled = append(unsettled, e)
			}
		}
		b.mu.Unlock()
		if len(unsettled) == 0 || b.sweep(ctx, unsettled) == nil {
			_, _ = b.client.Revoke(ctx, s.id)
		}
		b.mu.Lock()
		// Forget it either way: nobody keeps it alive any more, so a lease
		// that could not be revoked expires on its own.
		b.forgetLocked(s)
		b.mu.Unlock()
	})
}

// killSession records that s's lease is gone (expired or revoked behind
// our back).
func (b *backend) killSession(s *session) {
	b.mu.Lock()
	b.forgetLocked(s)
	b.mu.Unlock()
}

// keptAlive records a successful keep-alive of s sent at start.
func (b *backend) keptAlive(s *session, start time.Time) {
	b.mu.Lock()
	if start.After(s.validFrom) {
		s.validFrom = start
	}
	b.mu.Unlock()
}

// keepAlive renews s's lease once. A lease that is gone returns an error
// wrapping dlock.ErrNotHeld and forgets s.
func (b *backend) keepAlive(ctx context.Context, s *session) error {
	start := time.Now()
	rctx, cancel := b.rpc(ctx)
	_, err := b.client.KeepAliveOnce(rctx, s.id)
	cancel()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		b.killSession(s)
		return fmt.Errorf("%w: etcd lease %x expired or was revoked", dlock.ErrNotHeld, int64(s.id))
	case err != nil:
		return fmt.Errorf("dlock: etcd keep-alive: %w", err)
	}
	b.keptAlive(s, start)
	return nil
}

// newEntry reserves a slot for req on a live session with req's TTL (a
// shared one if one is free for the key, else a new lease) and returns the
// entry and the start from which a lock on it counts. peek, if not nil, is
// called before the first round trip that this takes.
func (b *backend) newEntry(ctx context.Context, req *dlock.Request, peek func()) (*entry, time.Time, error) {
	v, err := json.Marshal(value{Owner: req.Owner, Metadata: req.Config.Metadata})
	if err != nil {
		return nil, time.Time{}, err
	}
	val, ttl := string(v), req.Config.TTL
	sec := leaseSeconds(ttl)
	now := time.Now()
	b.mu.Lock()
	if s := b.pickLocked(req.Key, sec, now); s != nil {
		e := b.attachLocked(s, req, val)
		start, fresh := s.validity(ttl, now)
		b.mu.Unlock()
		if fresh {
			return e, start, nil
		}
		if peek != nil {
			peek()
			peek = nil
		}
		start = time.Now()
		err := b.keepAlive(ctx, s)
		if err == nil {
			return e, start, nil
		}
		b.gone(e) // nothing was created
		if !errors.Is(err, dlock.ErrNotHeld) {
			return nil, time.Time{}, err
		}
		// The lease expired: take a new one.
	} else {
		b.mu.Unlock()
	}
	if peek != nil {
		peek()
	}
	start := time.Now()
	rctx, cancel := b.rpc(ctx)
	resp, err := b.client.Grant(rctx, sec)
	cancel()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("dlock: etcd lease grant: %w", err)
	}
	s := &session{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, slots: map[string]*entry{}, validFrom: start}
	b.mu.Lock()
	b.sessions[sec] = append(b.sessions[sec], s)
	e := b.attachLocked(s, req, val)
	b.mu.Unlock()
	return e, start, nil
}

// leaseGone reports whether a create failed because e's lease no longer
// exists (nothing was created); it then forgets the session.
func (b *backend) leaseGone(e *entry, err error) bool {
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false
	}
	b.gone(e)
	b.killSession(e.s)
	return true
}

// value is what dlock stores in its queue key (etcdctl stores nothing).
type value struct {
	Owner    string            `json:"owner"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func parseValue(v []byte) value {
	var out value
	_ = json.Unmarshal(v, &out)
	return out
}

func (b *backend) notAcquired(key string, holder *mvccpb.KeyValue, cause error) *dlock.NotAcquiredError {
	na := &dlock.NotAcquiredError{Key: key, Cause: cause}
	if holder != nil {
		v := parseValue(holder.Value)
		na.Holder, na.Metadata = v.Owner, v.Metadata
		if na.Holder == "" {
			na.Holder = "lease " + strconv.FormatInt(holder.Lease, 16)
		}
	}
	return na
}

// Try implements dlock.Backend in one transaction: put this attempt's
// entry only if the queue is empty, else read its head (the holder).
// Nothing is left behind when the key is held.
func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	b.sweepKey(ctx, req.Key)
	pfx := b.queuePrefix(req.Key)
	for attempt := 0; ; attempt++ {
		e, start, err := b.newEntry(ctx, req, nil)
		if err != nil {
			return dlock.Grant{}, err
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id))).
			Else(clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
			Commit()
		cancel()
		if err != nil {
			if attempt == 0 && b.leaseGone(e, err) {
				continue
			}
			b.unknown(e)
			return dlock.Grant{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if !resp.Succeeded {
			b.gone(e) // nothing was put
			var holder *mvccpb.KeyValue
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				holder = kvs[0]
			}
			return dlock.Grant{}, b.notAcquired(req.Key, holder, nil)
		}
		e.rev = resp.Header.Revision
		return dlock.Grant{Lease: e, Token: uint64(e.rev), Start: start}, nil
	}
}

// enqueue puts this attempt's entry in the queue and reports whether it is
// first, with the first entry when it is not.
func (b *backend) enqueue(ctx context.Context, req *dlock.Request, peek func()) (*entry, bool, *mvccpb.KeyValue, time.Time, error) {
	pfx := b.queuePrefix(req.Key)
	for attempt := 0; ; attempt++ {
		e, start, err := b.newEntry(ctx, req, peek)
		peek = nil
		if err != nil {
			return nil, false, nil, time.Time{}, err
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", 0)).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id)), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
			Else(clientv3.OpGet(e.myKey)).
			Commit()
		cancel()
		if err != nil {
			if attempt == 0 && b.leaseGone(e, err) {
				continue
			}
			b.unknown(e)
			return nil, false, nil, time.Time{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if !resp.Succeeded {
			// An entry of this lease for the key that we had no record of
			// (a create that took effect after we gave up on it). Never
			// adopt it: delete it, and take another lease.
			b.mu.Lock()
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				e.rev, e.val = kvs[0].CreateRevision, string(kvs[0].Value)
			}
			r := b.orphanLocked(e, false)
			b.mu.Unlock()
			if r {
				b.revoke(e.s)
			}
			b.sweepKey(ctx, req.Key)
			if attempt < 2 {
				continue
			}
			return nil, false, nil, time.Time{}, fmt.Errorf("%w: etcd acquire %q: a stale entry of this client was in the way", dlock.ErrTransient, req.Key)
		}
		e.rev = resp.Header.Revision
		head := resp.Responses[1].GetResponseRange()
		if len(head.Kvs) == 0 || head.Kvs[0].CreateRevision == e.rev {
			return e, true, nil, start, nil
		}
		return e, false, head.Kvs[0], start, nil
	}
}

// errWaitEnded ends a wait whose context ended while etcd kept answering:
// Queue reports the holder it waited behind.
var errWaitEnded = errors.New("dlock: etcd wait ended by its context")

// errWaiterLeaseExpired ends a wait whose own lease expired.
var errWaiterLeaseExpired = errors.New("dlock: etcd lease of a waiting lock expired; its place in the queue is gone")

// Queue implements dlock.Queuer: wait in key's FIFO queue, watching only
// the entry just ahead (no herd), keeping the lease alive meanwhile. When
// ctx ends while etcd keeps answering, it returns at once a
// *dlock.NotAcquiredError naming the holder (the queue entry is removed in
// the background); when a request fails, or etcd stopped answering, it
// returns that error.
func (b *backend) Queue(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	b.sweepKey(ctx, req.Key)
	sent := time.Now()
	// A new or stale lease costs a round trip before the entry is put:
	// meanwhile, read the head, so that a context ending before the entry
	// is in still reports the holder seen.
	var peeked chan *mvccpb.KeyValue
	peek := func() {
		peeked = make(chan *mvccpb.KeyValue, 1)
		background.Go(func() {
			rctx, cancel := b.rpc(ctx)
			defer cancel()
			if g, err := b.client.Get(rctx, b.queuePrefix(req.Key), clientv3.WithFirstCreate()...); err == nil && len(g.Kvs) > 0 {
				peeked <- g.Kvs[0]
			}
		})
	}
	e, first, head, start, err := b.enqueue(ctx, req, peek)
	if err != nil {
		if ctx.Err() != nil && peeked != nil {
			select {
			case holder := <-peeked:
				return dlock.Grant{}, b.notAcquired(req.Key, holder, errors.Join(err, context.Cause(ctx)))
			default:
			}
		}
		return dlock.Grant{}, err
	}
	if first {
		return dlock.Grant{Lease: e, Token: uint64(e.rev), Start: start}, nil
	}
	w := &waiter{e: e, ttl: req.Config.TTL, head: head, lastOK: sent}
	start, err = w.wait(ctx)
	if err != nil {
		if !errors.Is(err, errWaiterLeaseExpired) {
			e.abandon()
		}
		if errors.Is(err, errWaitEnded) {
			return dlock.Grant{}, b.notAcquired(req.Key, w.head, context.Cause(ctx))
		}
		return dlock.Grant{}, err
	}
	return dlock.Grant{Lease: e, Token: uint64(e.rev), Start: start}, nil
}

// abandon removes a waiter's entry in the background (bounded by
// dlock.DefaultReleaseTimeout); if that fails, the entry stays an orphan
// and its delete is retried later.
func (e *entry) abandon() {
	e.b.orphan(e, false)
	background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		defer cancel()
		_ = e.b.sweep(ctx, []*entry{e})
	})
}

// waiter is one entry waiting for its turn.
type waiter struct {
	e      *entry
	ttl    time.Duration
	head   *mvccpb.KeyValue // the holder, as last read
	lastOK time.Time        // when the last request that etcd answered was sent
}

// ended is the outcome of a wait whose context ended (err: the request in
// flight then, if any): the holder if etcd answered recently, else that
// etcd did not answer.
func (w *waiter) ended(ctx context.Context, err error) error {
	if since := time.Since(w.lastOK); since >= waitRecency {
		if err == nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("dlock: etcd acquire %q: no answer from etcd in the last %v of the wait: %w", w.e.key, since.Round(time.Millisecond), err)
	}
	return errWaitEnded
}

// failed is the outcome of a request of the wait that returned err.
func (w *waiter) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return w.ended(ctx, err)
	}
	return fmt.Errorf("dlock: etcd acquire %q: %s: %w", w.e.key, what, err)
}

// keepAliveDue renews the lease when a third of the lock's TTL has passed
// since its last renewal.
func (w *waiter) keepAliveDue(ctx context.Context) error {
	s := w.e.s
	w.e.b.mu.Lock()
	due := time.Since(s.validFrom) >= w.ttl/3
	w.e.b.mu.Unlock()
	if !due {
		return nil
	}
	start := time.Now()
	if err := w.e.b.keepAlive(ctx, s); err != nil {
		if errors.Is(err, dlock.ErrNotHeld) {
			return fmt.Errorf("%w: %v", errWaiterLeaseExpired, err)
		}
		return w.failed(ctx, "keeping the lease alive", err)
	}
	w.lastOK = start
	w.e.b.sweepSession(ctx, s)
	return nil
}

// wait blocks until no entry with a smaller create revision is left, and
// returns the start from which the lock counts.
func (w *waiter) wait(ctx context.Context) (time.Time, error) {
	e, b := w.e, w.e.b
	pfx := b.queuePrefix(e.key)
	for {
		if ctx.Err() != nil {
			return time.Time{}, w.ended(ctx, nil)
		}
		// One round trip: the head, the nearest entry ahead of ours, ours.
		sent := time.Now()
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(e.rev-1))...),
			clientv3.OpGet(e.myKey, clientv3.WithKeysOnly()),
		).Commit()
		cancel()
		if err != nil {
			return time.Time{}, w.failed(ctx, "reading the queue", err)
		}
		w.lastOK = sent
		if mine := resp.Responses[2].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
			b.gone(e)
			return time.Time{}, errWaiterLeaseExpired
		}
		if head := resp.Responses[0].GetResponseRange().Kvs; len(head) > 0 {
			w.head = head[0]
		}
		ahead := resp.Responses[1].GetResponseRange().Kvs
		if len(ahead) == 0 {
			break
		}
		if err := w.waitDelete(ctx, ahead[0]); err != nil {
			return time.Time{}, err
		}
	}
	// First in the queue with our entry intact (read in the same
	// transaction): the lock counts from a fresh enough renewal of the lease.
	now := time.Now()
	b.mu.Lock()
	start, fresh := e.s.validity(w.ttl, now)
	b.mu.Unlock()
	if !fresh {
		start = time.Now()
		if err := b.keepAlive(ctx, e.s); err != nil {
			if errors.Is(err, dlock.ErrNotHeld) {
				return time.Time{}, fmt.Errorf("%w: %v", errWaiterLeaseExpired, err)
			}
			return time.Time{}, w.failed(ctx, "keeping the lease alive", err)
		}
	}
	return start, nil
}

// waitDelete waits until pred is deleted, keeping the lease alive and
// checking every waitProbe that etcd answers and that pred, the holder and
// our own entry are still there. The watch starts at the current
// revision: a watch from a past revision is served by etcd's catch-up
// loop, which runs only every 100ms (the tail concurrency.Mutex waiters
// see). A delete between our read and the watch's start is caught by
// reading pred again once the watch exists.
func (w *waiter) waitDelete(ctx context.Context, pred *mvccpb.KeyValue) error {
	b := w.e.b
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := b.client.Watch(wctx, string(pred.Key), clientv3.WithCreatedNotify())
	probe := time.NewTimer(waitProbe)
	defer probe.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if ctx.Err() != nil {
				return w.ended(ctx, nil)
			}
			if !ok || wr.Err() != nil {
				return nil // re-read the queue (and watch again)
			}
			if wr.Created {
				sent := time.Now()
				rctx, rcancel := b.rpc(ctx)
				g, err := b.client.Get(rctx, string(pred.Key), clientv3.WithKeysOnly())
				rcancel()
				if err != nil {
					return w.failed(ctx, "reading the entry ahead", err)
				}
				w.lastOK = sent
				if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
					return nil // already gone
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case <-probe.C:
			if err := w.keepAliveDue(ctx); err != nil {
				return err
			}
			// A stale entry of ours ahead of us (a release or a wait that
			// could not delete it) would hold us up until its lease expires.
			b.sweepKey(ctx, w.e.key)
			gone, err := w.probe(ctx, pred)
			if err != nil || gone {
				return err
			}
			probe.Reset(waitProbe)
		case <-ctx.Done():
			return w.ended(ctx, nil)
		}
	}
}

// probe checks, in one round trip of point reads, that pred and our entry
// are still there and whether the holder changed (re-reading the head only
// then). It reports whether pred is gone.
func (w *waiter) probe(ctx context.Context, pred *mvccpb.KeyValue) (bool, error) {
	e, b := w.e, w.e.b
	ops := []clientv3.Op{
		clientv3.OpGet(string(pred.Key), clientv3.WithKeysOnly()),
		clientv3.OpGet(e.myKey, clientv3.WithKeysOnly()),
	}
	withHead := append(ops, clientv3.OpGet(b.queuePrefix(e.key), clientv3.WithFirstCreate()...))
	sent := time.Now()
	rctx, cancel := b.rpc(ctx)
	txn := b.client.Txn(rctx)
	if w.head != nil {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(string(w.head.Key)), "=", w.head.CreateRevision)).
			Then(ops...).Else(withHead...)
	} else {
		txn = txn.Then(withHead...)
	}
	resp, err := txn.Commit()
	cancel()
	if err != nil {
		return false, w.failed(ctx, "checking the queue", err)
	}
	w.lastOK = sent
	if mine := resp.Responses[1].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
		b.gone(e)
		return false, errWaiterLeaseExpired
	}
	if len(resp.Responses) > 2 {
		if head := resp.Responses[2].GetResponseRange().Kvs; len(head) > 0 {
			w.head = head[0]
		}
	}
	p := resp.Responses[0].GetResponseRange().Kvs
	return len(p) == 0 || p[0].CreateRevision != pred.CreateRevision, nil
}

// sweepKey deletes this Locker's orphans of key before a new attempt on
// it, so that a stale entry of ours is never in the way (best effort).
func (b *backend) sweepKey(ctx context.Context, key string) {
	b.mu.Lock()
	if len(b.orphans) == 0 {
		b.mu.Unlock()
		return
	}
	var es []*entry
	for e := range b.orphans {
		if e.key == key {
			es = append(es, e)
		}
	}
	b.mu.Unlock()
	if len(es) > 0 {
		_ = b.sweep(ctx, es)
	}
}

// sweepSession deletes s's orphans (after a keep-alive of s), so that they
// do not linger while other locks keep the shared lease alive.
func (b *backend) sweepSession(ctx context.Context, s *session) {
	b.mu.Lock()
	if len(b.orphans) == 0 {
		b.mu.Unlock()
		return
	}
	var es []*entry
	for _, e := range s.slots {
		if e.state == entryOrphan {
			es = append(es, e)
		}
	}
	b.mu.Unlock()
	if len(es) > 0 {
		_ = b.sweep(ctx, es)
	}
}

// sweep deletes orphaned entries, each only if it is still the one we
// know: by create revision, or, for a create whose outcome is unknown, by
// value (it holds the attempt's unique owner id). An entry whose release
// was sent with an unknown outcome is deleted as a release is: with its
// receipt, and if it is gone its receipt tells whether a release of ours
// deleted it. One transaction per maxTxnOps - maxSpentOps entries, which
// also deletes spent receipts.
func (b *backend) sweep(ctx context.Context, es []*entry) error {
	const per = maxTxnOps - maxSpentOps
	for lo := 0; lo < len(es); lo += per {
		var revoke []*session
		var todo []*entry
		var ops []clientv3.Op
		var receipts []string
		b.mu.Lock()
		for _, e := range es[lo:min(lo+per, len(es))] {
			if e.deletedByUs { // a release settled it meanwhile
				if b.goneLocked(e) {
					revoke = append(revoke, e.s)
				}
				continue
			}
			cmp := clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", e.rev)
			then := []clientv3.Op{clientv3.OpDelete(e.myKey)}
			var els []clientv3.Op
			receipt := ""
			switch {
			case e.rev == 0:
				cmp = clientv3.Compare(clientv3.Value(e.myKey), "=", e.val)
			case e.released:
				receipt = e.receiptKey()
				then = append(then, clientv3.OpPut(receipt, "", clientv3.WithLease(e.s.id)))
				els = []clientv3.Op{clientv3.OpGet(receipt, clientv3.WithCountOnly())}
			}
			todo = append(todo, e)
			receipts = append(receipts, receipt)
			ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{cmp}, then, els))
		}
		var spent []clientv3.Op
		if len(todo) > 0 {
			spent = b.takeSpentLocked()
		}
		b.mu.Unlock()
		if len(todo) > 0 {
			rctx, cancel := b.rpc(ctx)
			resp, err := b.client.Txn(rctx).Then(append(ops, spent...)...).Commit()
			cancel()
			if err != nil {
				b.giveBackSpent(spent)
				for _, s := range revoke {
					b.revoke(s)
				}
				return fmt.Errorf("dlock: etcd delete of a stale queue entry: %w", err)
			}
			b.mu.Lock()
			for i, e := range todo {
				r := resp.Responses[i].GetResponseTxn()
				deleted := r.GetSucceeded()
				if deleted || (receipts[i] != "" && hasReceipt(r.GetResponses())) {
					e.deletedByUs = true
					if receipts[i] != "" {
						b.spent[receipts[i]] = struct{}{}
					}
				}
				// By revision, a missing entry can never come back; by
				// value, only a delete proves that the late create is spent.
				if (deleted || e.rev != 0) && b.goneLocked(e) {
					revoke = append(revoke, e.s)
				}
			}
			b.mu.Unlock()
		}
		for _, s := range revoke {
			b.revoke(s)
		}
	}
	return nil
}

// hasReceipt reports whether rs, the answer to an else branch that reads a
// receipt (first), found it.
func hasReceipt(rs []*etcdserverpb.ResponseOp) bool {
	return len(rs) > 0 && rs[0].GetResponseRange().GetCount() > 0
}

// Abort implements dlock.Aborter: remove this owner's queue entry if the
// request whose outcome is unknown had created it. The entry is deleted by
// its exact value or revision, so another owner's entry is never touched.
func (b *backend) Abort(ctx context.Context, req *dlock.Request) error {
	if err := b.check(); err != nil {
		return err
	}
	b.mu.Lock()
	var mine []*entry
	for e := range b.orphans {
		if e.owner == req.Owner {
			mine = append(mine, e)
		}
	}
	b.mu.Unlock()
	if len(mine) > 0 {
		return b.sweep(ctx, mine)
	}
	// No record of it (its session was forgotten): look it up by owner.
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(rctx, b.queuePrefix(req.Key), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		if parseValue(kv.Value).Owner != req.Owner {
			continue
		}
		if _, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit(); err != nil {
			return err
		}
	}
	return nil
}

func (e *entry) notHeld(why string) error {
	return fmt.Errorf("%w: etcd key %s (revision %d): %s", dlock.ErrNotHeld, e.myKey, e.rev, why)
}

// Bind implements dlock.LossNotifier: watch the lock's own entry from its
// create revision + 1 (so a delete before the watch exists is seen too)
// and report its deletion (a revoked or expired lease, an operator's
// delete) at once, not at the next renewal.
func (e *entry) Bind(lose func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go e.watchOwn(ctx, lose)
	return func() {
		e.b.mu.Lock()
		e.stopped = true
		e.b.mu.Unlock()
		cancel()
	}
}

func (e *entry) watchOwn(ctx context.Context, lose func(cause error)) {
	b := e.b
	// A lock released at once costs no watch: start it a little later
	// (from the create revision + 1, so nothing is missed meanwhile).
	t := time.NewTimer(watchDelay)
	select {
	case <-ctx.Done():
		t.Stop()
		return
	case <-t.C:
	}
	rev := e.rev + 1
	pause := 50 * time.Millisecond
	for i := 0; i < maxRewatch; i++ {
		for wr := range b.client.Watch(ctx, e.myKey, clientv3.WithRev(rev)) {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					e.deleted(lose, fmt.Sprintf("deleted behind the holder's back (revision %d)", ev.Kv.ModRevision))
					return
				}
			}
		}
		// The watch ended: the lock ended, the client closed, or etcd
		// cancelled it (a compaction). Read the entry and watch on from
		// there.
		if ctx.Err() != nil || b.client.Ctx().Err() != nil {
			return
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Second)
		rctx, cancel := b.rpc(ctx)
		g, err := b.client.Get(rctx, e.myKey)
		cancel()
		if err != nil {
			continue
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != e.rev {
			e.deleted(lose, "deleted behind the holder's back")
			return
		}
		rev = g.Header.Revision + 1
	}
}

// deleted reports a deletion seen by the entry's watch, unless the lock
// had already ended (then it may be our own release).
func (e *entry) deleted(lose func(error), why string) {
	b := e.b
	b.mu.Lock()
	if e.stopped {
		b.mu.Unlock()
		return
	}
	r := b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
	lose(e.notHeld(why))
}

// Refresh implements dlock.Lease: keep the lease alive and check the queue
// key is still ours.
func (e *entry) Refresh(ctx context.Context, ttl time.Duration) error {
	var out error
	e.b.RefreshBatch(ctx, []dlock.Renewal{{Lease: e, TTL: ttl}}, func(_ int, err error) { out = err })
	return out
}

// Release implements dlock.Lease: delete the queue key only if it still
// has our create revision, so a retried release never deletes a newer
// holder's key, and in the same transaction put the entry's receipt on its
// lease. A release that finds the entry gone returns nil if its receipt is
// there (an earlier release of ours deleted it and its reply was lost),
// and an error wrapping dlock.ErrNotHeld otherwise.
func (e *entry) Release(ctx context.Context) error {
	b := e.b
	b.mu.Lock()
	if e.deletedByUs {
		b.mu.Unlock()
		return nil
	}
	e.released = true
	spent := b.takeSpentLocked()
	b.mu.Unlock()
	receipt := e.receiptKey()
	rctx, cancel := b.rpc(ctx)
	resp, err := b.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", e.rev)).
		Then(append([]clientv3.Op{clientv3.OpDelete(e.myKey), clientv3.OpPut(receipt, "", clientv3.WithLease(e.s.id))}, spent...)...).
		Else(append([]clientv3.Op{clientv3.OpGet(receipt, clientv3.WithCountOnly())}, spent...)...).
		Commit()
	cancel()
	if err != nil {
		// It may or may not be deleted: keep its slot, retry the delete.
		b.giveBackSpent(spent)
		b.orphan(e, false)
		return fmt.Errorf("dlock: etcd release %q: %w", e.key, err)
	}
	b.mu.Lock()
	if resp.Succeeded || hasReceipt(resp.Responses) {
		e.deletedByUs = true
		b.spent[receipt] = struct{}{}
	}
	// A retried delete of ours (sweep) may have settled it meanwhile, and
	// its receipt may already be deleted as spent.
	deletedByUs := e.deletedByUs
	r := b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
	if deletedByUs {
		return nil
	}
	return e.notHeld("deleted before release, not by a request of this lock")
}

// RefreshBatch implements dlock.BatchRenewer: per distinct lease, one
// keep-alive and one transaction (per 128 keys) reading its entries, both
// at once; each lease's renewals are reported as soon as both answered, so
// a slow lease delays only its own locks.
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal, done func(int, error)) {
	if err := b.check(); err != nil {
		for i := range rs {
			done(i, err)
		}
		return
	}
	bySession := map[*session][]int{}
	var order []*session
	for i, r := range rs {
		s := r.Lease.(*entry).s
		if bySession[s] == nil {
			order = append(order, s)
		}
		bySession[s] = append(bySession[s], i)
	}
	var wg sync.WaitGroup
	for _, s := range order {
		wg.Go(func() { b.refreshSession(ctx, s, rs, bySession[s], done) })
	}
	wg.Wait()
}

// refreshSession renews the lease s and checks the entries rs[idx] on it.
func (b *backend) refreshSession(ctx context.Context, s *session, rs []dlock.Renewal, idx []int, done func(int, error)) {
	ka := make(chan error, 1)
	go func() { ka <- b.keepAlive(ctx, s) }()
	kvs := make([]*mvccpb.KeyValue, len(idx))
	var readErr error
	for lo := 0; lo < len(idx); lo += maxTxnOps {
		hi := min(lo+maxTxnOps, len(idx))
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, i := range idx[lo:hi] {
			ops = append(ops, clientv3.OpGet(rs[i].Lease.(*entry).myKey, clientv3.WithKeysOnly()))
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			readErr = err
			break
		}
		for j, rr := range resp.Responses {
			if got := rr.GetResponseRange().Kvs; len(got) > 0 {
				kvs[lo+j] = got[0]
			}
		}
	}
	kaErr := <-ka
	for j, i := range idx {
		e := rs[i].Lease.(*entry)
		var err error
		switch {
		case kaErr != nil:
			err = kaErr
		case readErr != nil:
			err = fmt.Errorf("dlock: etcd refresh %q: %w", e.key, readErr)
		case kvs[j] == nil || kvs[j].CreateRevision != e.rev:
			err = e.notHeld("deleted or replaced behind the holder's back")
			e.b.goneUnlessReleased(e)
		}
		done(i, err)
	}
	// Orphans on this lease would live as long as these locks keep it alive.
	if kaErr == nil {
		b.sweepSession(ctx, s)
	}
}

// Info describes a held lock.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Waiters is the number of queue entries behind the holder.
	Waiters int `json:"waiters"`
	// Lease is the holder's etcd lease id.
	Lease int64 `json:"lease"`
}

// List returns the held locks whose name starts with prefix: every queue
// "<EscapeKey(name)>/<lease hex>" with a leased key, the holder being the
// entry with the lowest create revision (etcdctl's locks included; their
// names are shown as they are, unescaped). Release receipts (see
// Release) are not locks and are skipped.
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	b := l.b
	if err := b.check(); err != nil {
		return nil, err
	}
	ctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(ctx, b.prefix+EscapeKey(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("dlock: etcd list: %w", err)
	}
	byName := map[string]*Info{}
	var order []string
	for _, kv := range resp.Kvs {
		if isReceipt(string(kv.Key)) {
			continue
		}
		k := strings.TrimPrefix(string(kv.Key), b.prefix)
		i := strings.LastIndexByte(k, '/')
		if i <= 0 || kv.Lease == 0 {
			continue
		}
		if _, err := strconv.ParseUint(k[i+1:], 16, 64); err != nil {
			continue
		}
		name := unescapeKey(k[:i])
		if in := byName[name]; in != nil {
			in.Waiters++
			continue
		}
		v := parseValue(kv.Value)
		byName[name] = &Info{Key: name, Owner: v.Owner, Token: uint64(kv.CreateRevision), Metadata: v.Metadata, Lease: kv.Lease}
		order = append(order, name)
	}
	out := make([]Info, 0, len(order))
	for _, name := range order {
		in := byName[name]
		ttl, err := b.client.TimeToLive(ctx, clientv3.LeaseID(in.Lease))
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("dlock: etcd list: %w", err)
			}
		} else if ttl.TTL > 0 {
			in.TTL = time.Duration(ttl.TTL) * time.Second
		}
		out = append(out, *in)
	}
	return out, nil
}
