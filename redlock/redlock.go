package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisx"
)

// Defaults.
const (
	// DefaultPrefix starts every key: "dlock:{<key>}" on each node, the
	// same layout as redislock.
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// DefaultNodeTimeoutFactor: each node gets TTL × this long to answer
	// (bounded by DefaultNodeTimeoutMin and DefaultNodeTimeoutMax).
	DefaultNodeTimeoutFactor = 0.05
	// DefaultNodeTimeoutMin is the smallest per-node timeout.
	DefaultNodeTimeoutMin = 50 * time.Millisecond
	// DefaultNodeTimeoutMax is the largest per-node timeout.
	DefaultNodeTimeoutMax = time.Second
	// FenceRetention is how long a node's fencing counter outlives the key's
	// last acquisition.
	FenceRetention = time.Hour
)

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix      string
	nodeTimeout time.Duration
}

// WithPrefix sets the key prefix on every node (default DefaultPrefix).
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithNodeTimeout fixes the time each node has to answer one request
// (default: TTL × DefaultNodeTimeoutFactor, within [DefaultNodeTimeoutMin,
// DefaultNodeTimeoutMax]).
func WithNodeTimeout(d time.Duration) Option { return func(o *options) { o.nodeTimeout = d } }

// Locker is the Redlock algorithm over N independent Redis masters: a lock
// is held when a majority of them granted it with validity left. It never
// closes the clients.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

type node struct {
	*redisx.Node
	name string
}

type backend struct {
	nodes       []*node
	quorum      int
	nodeTimeout time.Duration // 0: derived from the TTL
	err         error         // construction error, reported by every call
}

// New returns a Locker over clients, one per independent master (use an
// odd number, 3 or 5). Nil clients, an empty slice or a client listed twice
// give a Locker whose every call fails with an error wrapping
// dlock.ErrNilClient or dlock.ErrInvalidOption.
func New(clients []redis.UniversalClient, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.prefix == "" {
		o.prefix = DefaultPrefix
	}
	b := &backend{quorum: len(clients)/2 + 1, nodeTimeout: o.nodeTimeout}
	seen := map[redis.UniversalClient]bool{}
	for i, c := range clients {
		switch {
		case redisx.IsNil(c):
			b.err = fmt.Errorf("%w: redlock.New: client %d is nil", dlock.ErrNilClient, i)
		case seen[c]:
			b.err = fmt.Errorf("%w: redlock.New: client %d is listed twice; nodes must be independent", dlock.ErrInvalidOption, i)
		}
		if b.err != nil {
			break
		}
		seen[c] = true
		b.nodes = append(b.nodes, &node{Node: redisx.NewNode(c, o.prefix), name: nodeName(c, i)})
	}
	if len(clients) == 0 {
		b.err = fmt.Errorf("%w: redlock.New: no clients", dlock.ErrNilClient)
	}
	if o.nodeTimeout < 0 {
		b.err = fmt.Errorf("%w: redlock node timeout %v is negative", dlock.ErrInvalidOption, o.nodeTimeout)
	}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

func nodeName(c redis.UniversalClient, i int) string {
	if rc, ok := c.(*redis.Client); ok {
		return rc.Options().Addr
	}
	return fmt.Sprintf("node%d", i)
}

// Quorum is the number of nodes that must grant a lock.
func (l *Locker) Quorum() int { return l.b.quorum }

func (b *backend) timeout(ttl time.Duration) time.Duration {
	if b.nodeTimeout > 0 {
		return b.nodeTimeout
	}
	d := time.Duration(float64(ttl) * DefaultNodeTimeoutFactor)
	return min(max(d, DefaultNodeTimeoutMin), DefaultNodeTimeoutMax)
}

// Node outcomes in a QuorumError.
const (
	OutcomeGranted = "granted"
	OutcomeHeld    = "held"
	OutcomeFailed  = "failed"
	OutcomePending = "no answer yet"
)

// NodeResult is what one node answered.
type NodeResult struct {
	Node    string
	Outcome string
	// Holder is the owner holding the key there (Outcome == OutcomeHeld).
	Holder   string
	Metadata map[string]string
	Err      error
}

// QuorumError says, node by node, why an operation did not reach a
// majority. Acquisitions wrap it in a *dlock.NotAcquiredError when the key
// is held, so errors.Is(err, dlock.ErrNotAcquired) holds; when failing
// nodes alone make a majority impossible it is returned as is.
type QuorumError struct {
	Op      string // "acquire", "commit", "refresh", "release"
	Key     string
	Quorum  int
	Reason  string
	Results []NodeResult
}

func (e *QuorumError) count(outcome string) int {
	n := 0
	for _, r := range e.Results {
		if r.Outcome == outcome {
			n++
		}
	}
	return n
}

func (e *QuorumError) Error() string {
	s := fmt.Sprintf("dlock: redlock %s %q: %d/%d nodes %s, need %d", e.Op, e.Key, e.count(OutcomeGranted), len(e.Results), verb(e.Op), e.Quorum)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	for _, r := range e.Results {
		switch r.Outcome {
		case OutcomeHeld:
			s += fmt.Sprintf("; %s: held by %s", r.Node, dlock.HolderString(r.Holder, r.Metadata))
		case OutcomeFailed:
			s += fmt.Sprintf("; %s: %v", r.Node, r.Err)
		case OutcomePending:
			s += fmt.Sprintf("; %s: %s", r.Node, OutcomePending)
		}
	}
	return s
}

// Unwrap returns the node errors.
func (e *QuorumError) Unwrap() []error {
	var errs []error
	for _, r := range e.Results {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errs
}

func verb(op string) string {
	switch op {
	case "acquire":
		return "granted"
	case "refresh":
		return "extended"
	case "release":
		return "released"
	}
	return "confirmed"
}

// answer is one node's reply in a fan-out.
type answer struct {
	i   int
	ok  bool // granted / extended / released / committed
	o   redisx.Outcome
	err error
}

// fanOut runs op on every node in parallel, each bounded by timeout, and
// returns the channel of answers (buffered: senders never block, so
// stragglers finish on their own).
func (b *backend) fanOut(ctx context.Context, timeout time.Duration, idx []int, op func(ctx context.Context, n *node) answer) <-chan answer {
	ch := make(chan answer, len(idx))
	for _, i := range idx {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			a := op(nctx, b.nodes[i])
			cancel()
			a.i = i
			ch <- a
		}()
	}
	return ch
}

func (b *backend) all() []int {
	idx := make([]int, len(b.nodes))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// tally collects answers until ok reaches need (success) or the rest
// cannot reach it (failure). It returns the answers seen so far, indexed
// by node, and how many are still outstanding.
func tally(ch <-chan answer, total, need int) (seen map[int]answer, success bool) {
	seen = map[int]answer{}
	oks := 0
	for len(seen) < total {
		a := <-ch
		seen[a.i] = a
		if a.ok {
			oks++
		}
		if oks >= need {
			return seen, true
		}
		if oks+(total-len(seen)) < need {
			return seen, false
		}
	}
	return seen, false
}

// results turns answers into a QuorumError's node list.
func (b *backend) results(seen map[int]answer, okOutcome string) []NodeResult {
	rs := make([]NodeResult, len(b.nodes))
	for i, n := range b.nodes {
		rs[i] = NodeResult{Node: n.name, Outcome: OutcomePending}
		a, ok := seen[i]
		switch {
		case !ok:
		case a.err != nil:
			rs[i].Outcome, rs[i].Err = OutcomeFailed, a.err
		case a.ok:
			rs[i].Outcome = okOutcome
		default:
			rs[i].Outcome = OutcomeHeld
			rs[i].Holder, rs[i].Metadata = a.o.Holder.Owner, a.o.Holder.Metadata
		}
	}
	return rs
}

// Try implements dlock.Backend: phase one grants on a majority, phase two
// commits the quorum token on the granting majority.
func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if b.err != nil {
		return dlock.Grant{}, b.err
	}
	start := time.Now()
	cfg := req.Config
	meta, err := redisx.EncodeMetadata(cfg.Metadata)
	if err != nil {
		return dlock.Grant{}, err
	}
	timeout := b.timeout(cfg.TTL)
	lease := &lease{b: b, key: req.Key, owner: req.Owner, timeout: timeout}
	ch := b.fanOut(ctx, timeout, b.all(), func(ctx context.Context, n *node) answer {
		o, err := n.Grant(ctx, req.Key, req.Owner, cfg.TTL, meta, req.WaitID, waitScore(req.WaitID))
		return answer{ok: err == nil && o.Granted, o: o, err: err}
	})
	seen, ok := tally(ch, len(b.nodes), b.quorum)
	// Stragglers may still grant: release them if this attempt fails or the
	// lock is released before they answer.
	go lease.finish(ch, len(b.nodes)-len(seen), !ok)
	if !ok {
		lease.cleanup(seen)
		return dlock.Grant{}, b.acquireError(req.Key, seen)
	}
	var granted []int
	var tok uint64
	for i, a := range seen {
		if a.ok {
			granted = append(granted, i)
			tok = max(tok, a.o.Token)
		}
	}
	tok++
	if elapsed := time.Since(start); elapsed >= cfg.TTL-cfg.Drift() {
		lease.cleanup(seen)
		return dlock.Grant{}, b.noValidity(req.Key, seen, elapsed)
	}
	// Phase two: make the token durable on a majority before using it.
	cch := b.fanOut(ctx, timeout, granted, func(ctx context.Context, n *node) answer {
		ok, err := n.Commit(ctx, req.Key, req.Owner, tok, meta, cfg.TTL+FenceRetention)
		return answer{ok: ok, err: err}
	})
	cseen, ok := tally(cch, len(granted), b.quorum)
	if !ok {
		lease.cleanup(seen)
		return dlock.Grant{}, &QuorumError{Op: "commit", Key: req.Key, Quorum: b.quorum, Reason: "the token could not be recorded on a majority", Results: b.results(cseen, OutcomeGranted)}
	}
	if elapsed := time.Since(start); elapsed >= cfg.TTL-cfg.Drift() {
		lease.cleanup(seen)
		return dlock.Grant{}, b.noValidity(req.Key, seen, elapsed)
	}
	lease.mu.Lock()
	lease.token = tok
	lease.mu.Unlock()
	return dlock.Grant{Lease: lease, Token: tok}, nil
}

func (b *backend) noValidity(key string, seen map[int]answer, elapsed time.Duration) error {
	return &dlock.NotAcquiredError{Key: key, Cause: &QuorumError{Op: "acquire", Key: key, Quorum: b.quorum,
		Reason:  fmt.Sprintf("granted, but %v elapsed left no validity; released", elapsed.Round(time.Millisecond)),
		Results: b.results(seen, OutcomeGranted)}}
}

// acquireError reports a failed phase one: held somewhere → not acquired
// (the caller may wait); failing nodes alone → a quorum error.
func (b *backend) acquireError(key string, seen map[int]answer) error {
	qe := &QuorumError{Op: "acquire", Key: key, Quorum: b.quorum, Results: b.results(seen, OutcomeGranted)}
	failed := qe.count(OutcomeFailed)
	if failed > len(b.nodes)-b.quorum {
		qe.Reason = fmt.Sprintf("%d nodes failed: a majority is impossible", failed)
		return qe
	}
	na := &dlock.NotAcquiredError{Key: key, Cause: qe}
	// Report the holder seen on most nodes, and the shortest lease left.
	counts := map[string]int{}
	for _, a := range seen {
		if a.err == nil && !a.ok {
			counts[a.o.Holder.Owner]++
			if counts[a.o.Holder.Owner] > counts[na.Holder] || na.Holder == "" {
				na.Holder, na.Metadata = a.o.Holder.Owner, a.o.Holder.Metadata
			}
			if a.o.PTTL > 0 && (na.TTL == 0 || a.o.PTTL < na.TTL) {
				na.TTL = a.o.PTTL
			}
		}
	}
	return na
}

// Abort implements dlock.Aborter.
func (b *backend) Abort(ctx context.Context, req *dlock.Request) error {
	if b.err != nil {
		return b.err
	}
	l := &lease{b: b, key: req.Key, owner: req.Owner, timeout: b.timeout(req.Config.TTL)}
	return l.Release(ctx)
}

// lease is a lock held on a majority.
type lease struct {
	b          *backend
	key, owner string
	timeout    time.Duration

	mu       sync.Mutex
	token    uint64 // the committed quorum token; 0 until then
	released bool
}

// cleanup releases, in the background, every node that granted or did not
// answer cleanly in a failed attempt.
func (l *lease) cleanup(seen map[int]answer) {
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	var idx []int
	for i := range l.b.nodes {
		if a, ok := seen[i]; ok && a.err == nil && !a.ok {
			continue // held by someone else: nothing of ours there
		}
		idx = append(idx, i)
	}
	go l.releaseOn(idx)
}

// finish waits for the n straggling answers of phase one and releases any
// late grant if the attempt failed or the lock was released meanwhile.
func (l *lease) finish(ch <-chan answer, n int, failed bool) {
	for ; n > 0; n-- {
		a := <-ch
		if !a.ok && a.err == nil {
			continue
		}
		l.mu.Lock()
		gone := failed || l.released
		l.mu.Unlock()
		if gone {
			l.releaseOn([]int{a.i})
		}
	}
}

func (l *lease) releaseOn(idx []int) {
	if len(idx) == 0 {
		return
	}
	l.mu.Lock()
	tok := l.token
	l.mu.Unlock()
	ch := l.b.fanOut(context.Background(), l.timeout, idx, func(ctx context.Context, n *node) answer {
		ok, err := n.QuorumRelease(ctx, l.key, l.owner, tok, FenceRetention)
		return answer{ok: ok, err: err}
	})
	for range idx {
		<-ch
	}
}

// Refresh implements dlock.Lease: compare-and-pexpire on every node; held
// while a majority extended.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	ch := l.b.fanOut(ctx, l.timeout, l.b.all(), func(ctx context.Context, n *node) answer {
		ok, err := n.Refresh(ctx, l.key, l.owner, ttl)
		return answer{ok: ok, err: err}
	})
	seen, ok := tally(ch, len(l.b.nodes), l.b.quorum)
	if ok {
		return nil
	}
	return l.b.quorumLoss("refresh", l.key, seen)
}

// quorumLoss turns a failed refresh or release into ErrNotHeld when the
// nodes themselves said the lease is gone from a majority-breaking number
// of them, or into a transient quorum error otherwise.
func (b *backend) quorumLoss(op, key string, seen map[int]answer) error {
	qe := &QuorumError{Op: op, Key: key, Quorum: b.quorum, Results: b.results(seen, OutcomeGranted)}
	for i := range qe.Results {
		if qe.Results[i].Outcome == OutcomeHeld {
			qe.Results[i].Outcome = "not held"
		}
	}
	if qe.count("not held") > len(b.nodes)-b.quorum {
		return fmt.Errorf("%w: %w", dlock.ErrNotHeld, qe)
	}
	return qe
}

// Release implements dlock.Lease: compare-and-release (and publish) on
// every node, including those that never answered the acquisition. A
// node released already (a retry after a lost reply or an error) counts
// as released: it keeps a marker with the lease's token.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	l.released = true
	tok := l.token
	l.mu.Unlock()
	ch := l.b.fanOut(ctx, l.timeout, l.b.all(), func(ctx context.Context, n *node) answer {
		ok, err := n.QuorumRelease(ctx, l.key, l.owner, tok, FenceRetention)
		return answer{ok: ok, err: err}
	})
	// Every node gets the release; the caller waits only until a majority
	// released (the rest finish within the node timeout on their own).
	seen, ok := tally(ch, len(l.b.nodes), l.b.quorum)
	if ok {
		return nil
	}
	for _, a := range seen {
		if a.err != nil {
			return &QuorumError{Op: "release", Key: l.key, Quorum: l.b.quorum, Results: l.b.results(seen, OutcomeGranted)}
		}
	}
	return l.b.quorumLoss("release", l.key, seen)
}

// RefreshBatch implements dlock.BatchRenewer: one pipeline per node for all
// due leases, the nodes in parallel.
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal, done func(int, error)) {
	for i, err := range b.refreshAll(ctx, rs) {
		done(i, err)
	}
}

func (b *backend) refreshAll(ctx context.Context, rs []dlock.Renewal) []error {
	errs := make([]error, len(rs))
	if b.err != nil {
		for i := range errs {
			errs[i] = b.err
		}
		return errs
	}
	batch := make([]redisx.Renewal, len(rs))
	timeout := time.Duration(0)
	for i, r := range rs {
		l := r.Lease.(*lease)
		batch[i] = redisx.Renewal{Key: l.key, Owner: l.owner, TTL: r.TTL}
		timeout = max(timeout, l.timeout)
	}
	type nodeRes struct {
		held []bool
		errs []error
	}
	per := make([]nodeRes, len(b.nodes))
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		per[i].held, per[i].errs = make([]bool, len(batch)), make([]error, len(batch))
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			n.RefreshBatch(nctx, batch, func(j int, held bool, err error) {
				per[i].held[j], per[i].errs[j] = held, err
			})
		}()
	}
	wg.Wait()
	for j, r := range rs {
		seen := map[int]answer{}
		oks := 0
		for i := range b.nodes {
			a := answer{i: i, ok: per[i].held[j], err: per[i].errs[j]}
			seen[i] = a
			if a.ok {
				oks++
			}
		}
		if oks < b.quorum {
			errs[j] = b.quorumLoss("refresh", r.Lease.(*lease).key, seen)
		}
	}
	return errs
}

// Watch implements dlock.Watcher: a release published on any node wakes
// the waiter. It returns once a majority of nodes confirmed the
// subscription (a release is published on every node, so a majority
// hears it); the rest keep subscribing in the background.
func (b *backend) Watch(ctx context.Context, key string) (dlock.Subscription, error) {
	if b.err != nil {
		return nil, b.err
	}
	ms := &multiSub{ch: make(chan struct{}, 1), id: newWaitID()}
	done := make(chan bool, len(b.nodes))
	for _, n := range b.nodes {
		go func() {
			s, err := n.WatchInto(ctx, key, ms.id, ms.ch)
			if err == nil && !ms.add(s) {
				s.Close() // Close came first
			}
			done <- err == nil
		}()
	}
	ok := 0
	for range b.nodes {
		if <-done {
			ok++
		}
		if ok >= b.quorum {
			break
		}
	}
	if ok == 0 {
		ms.Close()
		return nil, fmt.Errorf("dlock: redlock watch %q: no node accepted the subscription", key)
	}
	return ms, nil
}

// newWaitID names a waiter: "<µs since epoch>-<random>". Every node queues
// it with the timestamp as score, so all nodes order waiters alike.
func newWaitID() string {
	return strconv.FormatInt(time.Now().UnixMicro(), 10) + "-" + dlock.NewOwner()[:8]
}

// waitScore is the queue score encoded in a wait id (0 for none).
func waitScore(id string) int64 {
	ts, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ts, 10, 64)
	return n
}

type multiSub struct {
	id     string
	ch     chan struct{}
	mu     sync.Mutex
	subs   []*redisx.Subscription
	closed bool
}

func (m *multiSub) add(s *redisx.Subscription) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.subs = append(m.subs, s)
	return true
}

func (m *multiSub) C() <-chan struct{} { return m.ch }

// WaitID implements dlock.WaitIDer.
func (m *multiSub) WaitID() string { return m.id }

func (m *multiSub) Close() {
	m.mu.Lock()
	subs := m.subs
	m.subs, m.closed = nil, true
	m.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
}

// Info describes a lock held on a majority of nodes.
type Info struct {
	redisx.Info
	// Nodes is how many nodes hold the lease.
	Nodes int `json:"nodes"`
}

// List returns the locks whose key starts with prefix that a majority of
// nodes hold for the same owner (SCAN on every node; for operators).
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	b := l.b
	if b.err != nil {
		return nil, b.err
	}
	type kv struct{ key, owner string }
	var (
		mu    sync.Mutex
		agg   = map[kv]*Info{}
		wg    sync.WaitGroup
		nerrs []error
	)
	for _, n := range b.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos, err := n.List(ctx, prefix)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				nerrs = append(nerrs, fmt.Errorf("%s: %w", n.name, err))
				return
			}
			for _, in := range infos {
				k := kv{in.Key, in.Owner}
				a := agg[k]
				if a == nil {
					a = &Info{Info: in}
					agg[k] = a
				}
				a.Nodes++
				a.Token = max(a.Token, in.Token)
				a.TTL = min(a.TTL, in.TTL)
			}
		}()
	}
	wg.Wait()
	if len(nerrs) > len(b.nodes)-b.quorum {
		return nil, fmt.Errorf("dlock: redlock list: %w", errors.Join(nerrs...))
	}
	var out []Info
	for _, a := range agg {
		if a.Nodes >= b.quorum {
			out = append(out, *a)
		}
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out, nil
}
