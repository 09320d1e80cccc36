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

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
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
	// DefaultRequestTimeout bounds each request to etcd made while
	// acquiring or listing (the etcd client otherwise waits for a
	// connection for as long as the context allows, so an unreachable
	// cluster would look like a held lock).
	DefaultRequestTimeout = 5 * time.Second
	// maxTxnOps is etcd's default limit of operations per transaction.
	maxTxnOps = 128
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

// WithRequestTimeout bounds each request made while acquiring or listing
// (default DefaultRequestTimeout).
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
	sessions map[int64][]*session // by lease TTL in seconds
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
	b := &backend{client: client, prefix: o.prefix, timeout: o.requestTimeout, sessions: map[int64][]*session{}}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

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
// '/', so the directory of one lock never contains another's entries.
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

// session is a lease shared by the locks and waiters of one Locker that use
// the same TTL, like a concurrency.Session. At most one lock or waiter per
// key uses a session, so two locks on one key taken through one Locker have
// different leases, and so different queue keys, and exclude each other.
type session struct {
	id  clientv3.LeaseID
	ttl time.Duration // the lease's TTL (whole seconds)

	// guarded by backend.mu
	keys      map[string]bool
	validFrom time.Time // start of the last successful grant or keep-alive
	dead      bool
}

func leaseSeconds(ttl time.Duration) int64 {
	return int64((ttl + time.Second - 1) / time.Second)
}

// session returns a live lease for key with the given TTL, reserving key on
// it, and the start of the request that last made it valid.
func (b *backend) session(ctx context.Context, key string, ttl time.Duration) (*session, time.Time, error) {
	sec := leaseSeconds(ttl)
	b.mu.Lock()
	var s *session
	live := b.sessions[sec][:0]
	for _, c := range b.sessions[sec] {
		if c.dead || (len(c.keys) == 0 && time.Since(c.validFrom) > c.ttl) {
			continue // expired on the server by now: forget it
		}
		live = append(live, c)
		if s == nil && !c.keys[key] {
			s = c
		}
	}
	b.sessions[sec] = live
	var from time.Time
	if s != nil {
		s.keys[key] = true
		from = s.validFrom
	}
	b.mu.Unlock()
	if s != nil {
		if time.Since(from) < s.ttl/3 {
			return s, from, nil // fresh enough: no round trip
		}
		start := time.Now()
		rctx, cancel := b.rpc(ctx)
		_, err := b.client.KeepAliveOnce(rctx, s.id)
		cancel()
		if err == nil {
			b.mu.Lock()
			s.validFrom = start
			b.mu.Unlock()
			return s, start, nil
		}
		b.done(s, key)
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, time.Time{}, fmt.Errorf("dlock: etcd keep-alive: %w", err)
		}
		b.mu.Lock()
		s.dead = true
		b.mu.Unlock()
	}
	start := time.Now()
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Grant(rctx, sec)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("dlock: etcd lease grant: %w", err)
	}
	s = &session{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, keys: map[string]bool{key: true}, validFrom: start}
	b.mu.Lock()
	b.sessions[sec] = append(b.sessions[sec], s)
	b.mu.Unlock()
	return s, start, nil
}

// done frees key on s.
func (b *backend) done(s *session, key string) {
	b.mu.Lock()
	delete(s.keys, key)
	b.mu.Unlock()
}

func (b *backend) keptAlive(s *session, start time.Time) {
	b.mu.Lock()
	if start.After(s.validFrom) {
		s.validFrom = start
	}
	b.mu.Unlock()
}

func (b *backend) markDead(s *session) {
	b.mu.Lock()
	s.dead = true
	b.mu.Unlock()
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

// entry is this attempt's place in key's queue.
type entry struct {
	b      *backend
	s      *session
	key    string // the lock name
	myKey  string // "<prefix>KEY/<lease hex>"
	rev    int64  // its create revision: the fencing token
	owner  string
	doneMu sync.Once
}

func (e *entry) free() { e.doneMu.Do(func() { e.b.done(e.s, e.key) }) }

// enqueue puts this attempt's key in the queue and reports whether it is
// first, with the first entry's value when it is not.
func (b *backend) enqueue(ctx context.Context, req *dlock.Request) (*entry, bool, *mvccpb.KeyValue, time.Time, error) {
	s, from, err := b.session(ctx, req.Key, req.Config.TTL)
	if err != nil {
		return nil, false, nil, time.Time{}, err
	}
	e := &entry{b: b, s: s, key: req.Key, owner: req.Owner, myKey: b.queuePrefix(req.Key) + strconv.FormatInt(int64(s.id), 16)}
	val, err := json.Marshal(value{Owner: req.Owner, Metadata: req.Config.Metadata})
	if err != nil {
		e.free()
		return nil, false, nil, time.Time{}, err
	}
	put := clientv3.OpPut(e.myKey, string(val), clientv3.WithLease(s.id))
	first := clientv3.OpGet(b.queuePrefix(req.Key), clientv3.WithFirstCreate()...)
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", 0)).
		Then(put, first).
		Else(clientv3.OpGet(e.myKey), put, first).
		Commit()
	if err != nil {
		e.free()
		return nil, false, nil, time.Time{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
	}
	e.rev = resp.Header.Revision
	owner := resp.Responses[1].GetResponseRange()
	if !resp.Succeeded {
		// A queue key of this lease left by an earlier attempt of ours
		// whose cleanup failed: take its place (and its turn) over.
		e.rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
		owner = resp.Responses[2].GetResponseRange()
	}
	if len(owner.Kvs) == 0 || owner.Kvs[0].CreateRevision == e.rev {
		return e, true, nil, from, nil
	}
	return e, false, owner.Kvs[0], from, nil
}

// dequeue deletes this entry's key if it is still ours.
func (e *entry) dequeue(ctx context.Context) (bool, error) {
	defer e.free()
	resp, err := e.b.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", e.rev)).
		Then(clientv3.OpDelete(e.myKey)).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
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

// Try implements dlock.Backend: enqueue, and leave the queue again unless
// first.
func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	e, first, holder, from, err := b.enqueue(ctx, req)
	if err != nil {
		return dlock.Grant{}, err
	}
	if first {
		return dlock.Grant{Lease: e, Token: uint64(e.rev), Start: from}, nil
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlock.DefaultReleaseTimeout)
	defer cancel()
	if _, err := e.dequeue(dctx); err != nil {
		return dlock.Grant{}, fmt.Errorf("dlock: etcd acquire %q: leaving the queue: %w", req.Key, err)
	}
	return dlock.Grant{}, b.notAcquired(req.Key, holder, nil)
}

// errWaiterLeaseExpired ends a wait whose own lease expired.
var errWaiterLeaseExpired = errors.New("dlock: etcd lease of a waiting lock expired; its place in the queue is gone")

// Queue implements dlock.Queuer: wait in key's FIFO queue, watching only
// the entry just ahead (no herd), keeping the lease alive meanwhile.
func (b *backend) Queue(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	e, first, holder, from, err := b.enqueue(ctx, req)
	if err != nil {
		return dlock.Grant{}, err
	}
	if !first {
		from, err = e.wait(ctx, req.Config.TTL, from)
		if err != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlock.DefaultReleaseTimeout)
			_, _ = e.dequeue(dctx)
			cancel()
			if ctx.Err() != nil {
				return dlock.Grant{}, b.notAcquired(req.Key, holder, errors.Join(err, context.Cause(ctx)))
			}
			return dlock.Grant{}, err
		}
	}
	return dlock.Grant{Lease: e, Token: uint64(e.rev), Start: from}, nil
}

// wait blocks until no entry with a smaller create revision is left, and
// returns the start of the lease's last successful keep-alive (initially
// from).
func (e *entry) wait(ctx context.Context, ttl time.Duration, from time.Time) (time.Time, error) {
	b := e.b
	pfx := b.queuePrefix(e.key)
	tick := time.NewTicker(max(ttl/3, 10*time.Millisecond))
	defer tick.Stop()
	keepAlive := func() error {
		start := time.Now()
		rctx, cancel := b.rpc(ctx)
		defer cancel()
		ka, err := b.client.KeepAliveOnce(rctx, e.s.id)
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ka.TTL <= 0):
			b.markDead(e.s)
			return fmt.Errorf("%w: %v", errWaiterLeaseExpired, err)
		case err != nil:
			return nil // transient: try again at the next tick
		}
		b.keptAlive(e.s, start)
		from = start
		return nil
	}
	for {
		// One round trip: the nearest entry ahead of ours, and ours.
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(e.rev-1))...),
			clientv3.OpGet(e.myKey),
		).Commit()
		cancel()
		if err != nil {
			return from, err
		}
		if mine := resp.Responses[1].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
			b.markDead(e.s)
			return from, errWaiterLeaseExpired
		}
		ahead := resp.Responses[0].GetResponseRange().Kvs
		if len(ahead) == 0 {
			break
		}
		if err := e.waitDelete(ctx, ahead[0], tick, keepAlive); err != nil {
			return from, err
		}
	}
	// First in the queue with our entry intact (read in the same
	// transaction). Start the lock with a freshly renewed lease unless the
	// last renewal is recent.
	if time.Since(from) > ttl/3 {
		if err := keepAlive(); err != nil {
			return from, err
		}
	}
	return from, nil
}

// waitDelete waits until pred is deleted, keeping the lease alive. The
// watch starts at the current revision: a watch from a past revision is
// served by etcd's catch-up loop, which runs only every 100ms (the tail
// concurrency.Mutex waiters see). A delete between our read and the
// watch's start is caught by reading pred again once the watch exists.
func (e *entry) waitDelete(ctx context.Context, pred *mvccpb.KeyValue, tick *time.Ticker, keepAlive func() error) error {
	b := e.b
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := b.client.Watch(wctx, string(pred.Key), clientv3.WithCreatedNotify())
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return ctx.Err() // nil: re-read the queue
			}
			if wr.Created {
				rctx, rcancel := b.rpc(ctx)
				g, err := b.client.Get(rctx, string(pred.Key))
				rcancel()
				if err != nil {
					return err
				}
				if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
					return nil // already gone
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case <-tick.C:
			if err := keepAlive(); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Abort implements dlock.Aborter: remove this owner's queue entry if the
// lost reply had created it.
func (b *backend) Abort(ctx context.Context, req *dlock.Request) error {
	if err := b.check(); err != nil {
		return err
	}
	resp, err := b.client.Get(ctx, b.queuePrefix(req.Key), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		if parseValue(kv.Value).Owner == req.Owner {
			_, err = b.client.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
				Then(clientv3.OpDelete(string(kv.Key))).Commit()
		}
	}
	return err
}

func (e *entry) notHeld(why string) error {
	return fmt.Errorf("%w: etcd key %s (revision %d): %s", dlock.ErrNotHeld, e.myKey, e.rev, why)
}

// Refresh implements dlock.Lease: keep the lease alive and check the queue
// key is still ours.
func (e *entry) Refresh(ctx context.Context, _ time.Duration) error {
	errs := e.b.refreshAll(ctx, []dlock.Renewal{{Lease: e}})
	return errs[0]
}

// Release implements dlock.Lease: delete the queue key only if it still
// has our create revision, so a retried release never deletes a newer
// holder's key.
func (e *entry) Release(ctx context.Context) error {
	ok, err := e.dequeue(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("dlock: etcd release %q: %w", e.key, err)
	case !ok:
		return e.notHeld("deleted or replaced before release")
	}
	return nil
}

// RefreshBatch implements dlock.BatchRenewer: one keep-alive per distinct
// lease, and one transaction (per 128 keys) reading every queue key.
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal, done func(int, error)) {
	for i, err := range b.refreshAll(ctx, rs) {
		done(i, err)
	}
}

func (b *backend) refreshAll(ctx context.Context, rs []dlock.Renewal) []error {
	errs := make([]error, len(rs))
	if err := b.check(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	leaseErr := map[*session]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range rs {
		s := r.Lease.(*entry).s
		if _, ok := leaseErr[s]; ok {
			continue
		}
		leaseErr[s] = nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			ka, err := b.client.KeepAliveOnce(ctx, s.id)
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ka.TTL <= 0):
				b.markDead(s)
				err = fmt.Errorf("%w: etcd lease %x expired or was revoked", dlock.ErrNotHeld, int64(s.id))
			case err == nil:
				b.keptAlive(s, start)
			}
			mu.Lock()
			leaseErr[s] = err
			mu.Unlock()
		}()
	}
	// Meanwhile, read every queue key in as few round trips as possible.
	kvs := make([]*mvccpb.KeyValue, len(rs))
	var readErr error
	for lo := 0; lo < len(rs); lo += maxTxnOps {
		hi := min(lo+maxTxnOps, len(rs))
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, r := range rs[lo:hi] {
			ops = append(ops, clientv3.OpGet(r.Lease.(*entry).myKey))
		}
		resp, err := b.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			readErr = err
			break
		}
		for i, rr := range resp.Responses {
			if got := rr.GetResponseRange().Kvs; len(got) > 0 {
				kvs[lo+i] = got[0]
			}
		}
	}
	wg.Wait()
	for i, r := range rs {
		e := r.Lease.(*entry)
		switch {
		case leaseErr[e.s] != nil:
			errs[i] = leaseErr[e.s]
		case readErr != nil:
			errs[i] = fmt.Errorf("dlock: etcd refresh %q: %w", e.key, readErr)
		case kvs[i] == nil || kvs[i].CreateRevision != e.rev:
			errs[i] = e.notHeld("deleted or replaced behind the holder's back")
		}
		if errors.Is(errs[i], dlock.ErrNotHeld) {
			e.free()
		}
	}
	return errs
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
// names are shown as they are, unescaped).
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
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
		if ttl, err := b.client.TimeToLive(ctx, clientv3.LeaseID(in.Lease)); err == nil && ttl.TTL > 0 {
			in.TTL = time.Duration(ttl.TTL) * time.Second
		}
		out = append(out, *in)
	}
	return out, nil
}
