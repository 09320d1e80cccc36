package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
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
	// MetaReservedForWaiter is the metadata key reported (in a
	// *dlock.NotAcquiredError and a NodeResult) for a key nobody holds but
	// that a release reserved (for 100ms) for the waiter it woke: its value
	// is that waiter's id, and the holder is empty.
	MetaReservedForWaiter = redisproto.MetaReservedForWaiter
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
	*redisproto.Node
	name     string
	renewing atomic.Bool // a RefreshBatch pipeline to this node is running
}

type backend struct {
	waiters     redisproto.Waiters
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
		case redisproto.IsNil(c):
			b.err = fmt.Errorf("%w: redlock.New: client %d is nil", dlock.ErrNilClient, i)
		case seen[c]:
			b.err = fmt.Errorf("%w: redlock.New: client %d is listed twice; nodes must be independent", dlock.ErrInvalidOption, i)
		}
		if b.err != nil {
			break
		}
		seen[c] = true
		b.nodes = append(b.nodes, &node{Node: redisproto.NewNode(c, o.prefix), name: nodeName(c, i)})
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
	// OutcomeGranted: the node did what was asked (granted, committed,
	// extended or released).
	OutcomeGranted = "granted"
	// OutcomeHeld: acquire: someone else holds the key on the node, or a
	// release reserved it for the waiter it woke (Holder empty,
	// Metadata[MetaReservedForWaiter] that waiter's id).
	OutcomeHeld = "held"
	// OutcomeGone: commit, refresh, release: the node no longer holds the
	// lease (expired, deleted or taken).
	OutcomeGone = "lease gone"
	// OutcomeFailed: the node answered with an error.
	OutcomeFailed = "failed"
	// OutcomeNoAnswer: the node did not answer within the per-node timeout
	// (or before the caller's context ended); what it did is unknown.
	OutcomeNoAnswer = "no answer"
	// OutcomePending: the outcome was decided before the node answered.
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
// is held, so errors.Is(err, dlock.ErrNotAcquired) holds; in an error
// wrapping dlock.ErrTransient when the attempt may succeed if repeated (a
// majority granted but the commit or the validity check failed); when
// failing nodes alone make a majority impossible it is returned as is.
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
			if id := r.Metadata[MetaReservedForWaiter]; r.Holder == "" && id != "" {
				s += fmt.Sprintf("; %s: reserved for waiter %s", r.Node, id)
				continue
			}
			s += fmt.Sprintf("; %s: held by %s", r.Node, dlock.HolderString(r.Holder, r.Metadata))
		case OutcomeGone, OutcomePending:
			s += fmt.Sprintf("; %s: %s", r.Node, r.Outcome)
		case OutcomeFailed, OutcomeNoAnswer:
			s += fmt.Sprintf("; %s: %v", r.Node, r.Err)
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
	i        int
	ok       bool // granted / extended / released / committed
	o        redisproto.Outcome
	err      error
	noAnswer bool // err says the node did not answer in time
}

// fanOut runs op on the nodes idx in parallel, each bounded by timeout,
// and returns the channel of answers (buffered: senders never block, so
// stragglers finish on their own, within the client's timeouts). An error
// that is a timeout (the per-node context, which a client honours while
// dialling or waiting for a connection, or the client's own read timeout)
// counts as no answer.
func (b *backend) fanOut(ctx context.Context, timeout time.Duration, idx []int, op func(ctx context.Context, n *node) answer) <-chan answer {
	ch := make(chan answer, len(idx))
	for _, i := range idx {
		background.Go(func() {
			nctx, cancel := context.WithTimeout(ctx, timeout)
			a := op(nctx, b.nodes[i])
			cancel()
			a.i = i
			if a.err != nil && isTimeout(a.err) {
				a.noAnswer = true
				a.err = fmt.Errorf("no answer within %v: %w", timeout, a.err)
			}
			ch <- a
		})
	}
	return ch
}

// isTimeout reports whether err says that no answer came in time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout())
}

func (b *backend) all() []int {
	idx := make([]int, len(b.nodes))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// tallied is the outcome of tally.
type tallied struct {
	// seen has the answer of every node that answered, and a no-answer for
	// each node that had not when the timeout or ctx ended the wait.
	seen map[int]answer
	ok   bool
	// received counts the answers taken from the channel; the others are
	// still to come.
	received int
}

// tally collects the answers of the nodes idx until ok reaches need
// (success) or the rest cannot reach it (failure). A node that has not
// answered when timeout passes or ctx ends counts as failed: the per-node
// context of fanOut bounds the request only if the client honours it, and
// a default go-redis client on a stalled link waits for its read timeout
// and retries instead.
func tally(ctx context.Context, ch <-chan answer, idx []int, need int, timeout time.Duration) tallied {
	r := tallied{seen: make(map[int]answer, len(idx))}
	oks := 0
	take := func(a answer) {
		r.seen[a.i] = a
		r.received++
		if a.ok {
			oks++
		}
	}
	decided := func() bool {
		if oks >= need {
			r.ok = true
			return true
		}
		return oks+len(idx)-len(r.seen) < need
	}
	expire := func(err error) {
		for drained := false; !drained; { // answers already in count
			select {
			case a := <-ch:
				take(a)
			default:
				drained = true
			}
		}
		for _, i := range idx {
			if _, ok := r.seen[i]; !ok {
				r.seen[i] = answer{i: i, err: err, noAnswer: true}
			}
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for !decided() {
		select {
		case a := <-ch:
			take(a)
		case <-timer.C:
			expire(fmt.Errorf("no answer within %v", timeout))
		case <-ctx.Done():
			expire(fmt.Errorf("no answer before the context ended: %w", context.Cause(ctx)))
		}
	}
	return r
}

// results turns the answers of the nodes idx to op into a QuorumError's
// node list.
func (b *backend) results(op string, seen map[int]answer, idx []int) []NodeResult {
	rs := make([]NodeResult, 0, len(idx))
	for _, i := range idx {
		r := NodeResult{Node: b.nodes[i].name, Outcome: OutcomePending}
		a, ok := seen[i]
		switch {
		case !ok:
		case a.noAnswer:
			r.Outcome, r.Err = OutcomeNoAnswer, a.err
		case a.err != nil:
			r.Outcome, r.Err = OutcomeFailed, a.err
		case a.ok:
			r.Outcome = OutcomeGranted
		case op == "acquire":
			r.Outcome = OutcomeHeld
			r.Holder, r.Metadata = a.o.Holder.Owner, a.o.Holder.Metadata
		default:
			r.Outcome = OutcomeGone
		}
		rs = append(rs, r)
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
	meta, err := redisproto.EncodeMetadata(cfg.Metadata)
	if err != nil {
		return dlock.Grant{}, err
	}
	timeout := b.timeout(cfg.TTL)
	lease := &lease{b: b, key: req.Key, owner: req.Owner, timeout: timeout}
	all := b.all()
	ch := b.fanOut(ctx, timeout, all, func(ctx context.Context, n *node) answer {
		defer b.waiters.Begin(req.WaitID)() // may queue the waiter
		o, err := n.Grant(ctx, req.Key, req.Owner, cfg.TTL, meta, req.WaitID, waitScore(req.WaitID))
		return answer{ok: err == nil && o.Granted, o: o, err: err}
	})
	r := tally(ctx, ch, all, b.quorum, timeout)
	// Stragglers may still grant: release them if this attempt fails or the
	// lock is released before they answer.
	background.Go(func() { lease.finish(ch, len(all)-r.received, !r.ok) })
	if !r.ok {
		lease.cleanup(r.seen)
		return dlock.Grant{}, b.acquireError(req.Key, r.seen)
	}
	var granted []int
	var tok uint64
	for _, i := range all {
		if a := r.seen[i]; a.ok {
			granted = append(granted, i)
			tok = max(tok, a.o.Token)
		}
	}
	tok++
	if elapsed := time.Since(start); elapsed >= cfg.TTL-cfg.Drift() {
		lease.cleanup(r.seen)
		return dlock.Grant{}, b.noValidity(req.Key, r.seen, elapsed)
	}
	// Phase two: make the token durable on a majority before using it.
	cch := b.fanOut(ctx, timeout, granted, func(ctx context.Context, n *node) answer {
		ok, err := n.Commit(ctx, req.Key, req.Owner, tok, meta, cfg.TTL+FenceRetention)
		return answer{ok: ok, err: err}
	})
	cr := tally(ctx, cch, granted, b.quorum, timeout)
	if !cr.ok {
		// A majority granted, so the key was free: a commit that missed
		// its majority (a node slow or failing, a lease that expired
		// meanwhile) may well succeed next time.
		lease.cleanup(r.seen)
		return dlock.Grant{}, fmt.Errorf("%w: %w", dlock.ErrTransient, &QuorumError{Op: "commit", Key: req.Key, Quorum: b.quorum,
			Reason:  "a majority granted, but the token could not be recorded on a majority; released",
			Results: b.results("commit", cr.seen, granted)})
	}
	if elapsed := time.Since(start); elapsed >= cfg.TTL-cfg.Drift() {
		lease.cleanup(r.seen)
		return dlock.Grant{}, b.noValidity(req.Key, r.seen, elapsed)
	}
	lease.mu.Lock()
	lease.token = tok
	lease.mu.Unlock()
	return dlock.Grant{Lease: lease, Token: tok}, nil
}

// noValidity reports a majority granted too late to be used: transient,
// the key was free.
func (b *backend) noValidity(key string, seen map[int]answer, elapsed time.Duration) error {
	return fmt.Errorf("%w: %w", dlock.ErrTransient, &QuorumError{Op: "acquire", Key: key, Quorum: b.quorum,
		Reason:  fmt.Sprintf("granted, but %v elapsed left no validity; released", elapsed.Round(time.Millisecond)),
		Results: b.results("acquire", seen, b.all())})
}

// acquireError reports a failed phase one: nodes answering with errors
// alone make a majority impossible → a quorum error (Acquire ends); errors
// and nodes that did not answer in time → the same, wrapping
// dlock.ErrTransient (Acquire tries again until its deadline: a hung or
// unreachable node may come back); otherwise the key is held somewhere →
// not acquired (the caller may wait).
func (b *backend) acquireError(key string, seen map[int]answer) error {
	qe := &QuorumError{Op: "acquire", Key: key, Quorum: b.quorum, Results: b.results("acquire", seen, b.all())}
	failed, silent := qe.count(OutcomeFailed), qe.count(OutcomeNoAnswer)
	switch {
	case failed > len(b.nodes)-b.quorum:
		qe.Reason = fmt.Sprintf("%d nodes failed: a majority is impossible", failed)
		return qe
	case failed+silent > len(b.nodes)-b.quorum:
		qe.Reason = fmt.Sprintf("%d nodes failed or did not answer: a majority is impossible for now; released", failed+silent)
		return fmt.Errorf("%w: %w", dlock.ErrTransient, qe)
	}
	// Otherwise at least one node said the key is held.
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
	background.Go(func() { l.releaseOn(idx) })
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

// releaseOn releases the nodes idx, each bounded by the node timeout, and
// waits for their answers (the client's timeouts bound a stalled one).
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
	all := l.b.all()
	ch := l.b.fanOut(ctx, l.timeout, all, func(ctx context.Context, n *node) answer {
		ok, err := n.Refresh(ctx, l.key, l.owner, ttl)
		return answer{ok: ok, err: err}
	})
	r := tally(ctx, ch, all, l.b.quorum, l.timeout)
	if r.ok {
		return nil
	}
	return l.b.quorumLoss("refresh", l.key, r.seen)
}

// quorumLoss turns a failed refresh or release into ErrNotHeld when the
// nodes themselves said the lease is gone from a majority-breaking number
// of them, or into a transient quorum error otherwise.
func (b *backend) quorumLoss(op, key string, seen map[int]answer) error {
	qe := &QuorumError{Op: op, Key: key, Quorum: b.quorum, Results: b.results(op, seen, b.all())}
	if qe.count(OutcomeGone) > len(b.nodes)-b.quorum {
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
	all := l.b.all()
	// Every node gets the release; the caller waits only until a majority
	// released, and the rest finish within the node timeout on their own:
	// their requests must not end with the caller's context (the core
	// cancels it as soon as Release returns, and a request still waiting
	// for a connection would then never be sent, leaving the lease on that
	// node until it expires).
	ch := l.b.fanOut(context.WithoutCancel(ctx), l.timeout, all, func(ctx context.Context, n *node) answer {
		ok, err := n.QuorumRelease(ctx, l.key, l.owner, tok, FenceRetention)
		return answer{ok: ok, err: err}
	})
	r := tally(ctx, ch, all, l.b.quorum, l.timeout)
	if r.ok {
		return nil
	}
	return l.b.quorumLoss("release", l.key, r.seen)
}

// RefreshBatch implements dlock.BatchRenewer: one pipeline per node for all
// due leases, the nodes in parallel. Each renewal is reported as soon as a
// majority of nodes extended it (or a majority can no longer do so): a
// slow or hung minority delays nothing. A node that has not answered
// within the node timeout counts as failed, and a node whose previous
// renewal pipeline is still running is not sent another one (it counts as
// not answering), so renewals do not pile up on a hung node.
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal, done func(int, error)) {
	if b.err != nil {
		for i := range rs {
			done(i, b.err)
		}
		return
	}
	if len(rs) == 0 {
		return
	}
	batch := make([]redisproto.Renewal, len(rs))
	keys := make([]string, len(rs))
	timeout := time.Duration(0)
	for i, r := range rs {
		l := r.Lease.(*lease)
		batch[i] = redisproto.Renewal{Key: l.key, Owner: l.owner, TTL: r.TTL}
		keys[i] = l.key
		timeout = max(timeout, l.timeout)
	}
	bt := newBatchTally(b, keys, done)
	for i, n := range b.nodes {
		if !n.renewing.CompareAndSwap(false, true) {
			bt.nodeSilent(i, errors.New("no answer: its previous renewal is still running"))
			continue
		}
		background.Go(func() {
			defer n.renewing.Store(false)
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			n.RefreshBatch(nctx, batch, func(j int, held bool, err error) {
				bt.report(i, answer{i: i, ok: held && err == nil, err: err}, j)
			})
		})
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-bt.all:
	case <-timer.C:
		bt.end(fmt.Errorf("no answer within %v", timeout))
	case <-ctx.Done():
		bt.end(fmt.Errorf("no answer before the renewal's deadline: %w", context.Cause(ctx)))
	}
}

// batchTally decides each renewal of a RefreshBatch from the nodes'
// answers as they arrive.
type batchTally struct {
	b    *backend
	keys []string
	done func(int, error)
	all  chan struct{} // closed when every renewal is decided

	mu      sync.Mutex
	seen    []map[int]answer // per renewal, per node
	decided []bool
	left    int
	ended   bool
}

func newBatchTally(b *backend, keys []string, done func(int, error)) *batchTally {
	bt := &batchTally{b: b, keys: keys, done: done, all: make(chan struct{}),
		seen: make([]map[int]answer, len(keys)), decided: make([]bool, len(keys)), left: len(keys)}
	for j := range bt.seen {
		bt.seen[j] = make(map[int]answer, len(b.nodes))
	}
	return bt
}

// report records node i's answer for renewal j.
func (bt *batchTally) report(i int, a answer, j int) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if bt.ended || j < 0 || j >= len(bt.keys) {
		return
	}
	bt.seen[j][i] = a
	bt.decideLocked(j, false)
}

// nodeSilent records that node i will not answer any renewal.
func (bt *batchTally) nodeSilent(i int, err error) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	for j := range bt.keys {
		bt.seen[j][i] = answer{i: i, err: err, noAnswer: true}
		bt.decideLocked(j, false)
	}
}

// end decides every renewal still open, the silent nodes counting as
// failed, and ignores later answers.
func (bt *batchTally) end(err error) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	for j := range bt.keys {
		if bt.decided[j] {
			continue
		}
		for i := range bt.b.nodes {
			if _, ok := bt.seen[j][i]; !ok {
				bt.seen[j][i] = answer{i: i, err: err, noAnswer: true}
			}
		}
		bt.decideLocked(j, true)
	}
	bt.ended = true
}

// decideLocked reports renewal j if its outcome is known (always when
// final). bt.mu held.
func (bt *batchTally) decideLocked(j int, final bool) {
	if bt.decided[j] {
		return
	}
	n, need := len(bt.b.nodes), bt.b.quorum
	oks, gone := 0, 0
	for _, a := range bt.seen[j] {
		switch {
		case a.ok:
			oks++
		case a.err == nil:
			gone++
		}
	}
	var err error
	switch {
	case oks >= need:
	case gone > n-need || oks+n-len(bt.seen[j]) < need || final:
		err = bt.b.quorumLoss("refresh", bt.keys[j], bt.seen[j])
	default:
		return
	}
	bt.decided[j] = true
	bt.done(j, err)
	if bt.left--; bt.left == 0 {
		close(bt.all)
	}
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
	nodes := make([]*redisproto.Node, len(b.nodes))
	for i, n := range b.nodes {
		nodes[i] = n.Node
	}
	// Its grants queue it on every node, including those whose
	// subscription fails: Close dequeues it from all.
	ms.w = b.waiters.Add(key, ms.id, nodes...)
	done := make(chan bool, len(b.nodes))
	for _, n := range b.nodes {
		background.Go(func() {
			s, err := n.WatchInto(ctx, key, ms.id, ms.ch)
			if err == nil && !ms.add(s) {
				s.Close() // Close came first
			}
			done <- err == nil
		})
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
	w      *redisproto.Waiter
	ch     chan struct{}
	mu     sync.Mutex
	subs   []*redisproto.Subscription
	closed bool
}

func (m *multiSub) add(s *redisproto.Subscription) bool {
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

// Close ends the subscriptions and dequeues the waiter on every node, in
// the background once none of its grants is in flight; it never waits on
// the network.
func (m *multiSub) Close() {
	m.mu.Lock()
	subs := m.subs
	m.subs, m.closed = nil, true
	m.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
	m.w.Leave()
}

// Info describes a lock held on a majority of nodes.
type Info struct {
	redisproto.Info
	// Nodes is how many nodes hold the lease.
	Nodes int `json:"nodes"`
}

// errNilContext is returned by List for a nil context, like dlock's
// Acquire does.
var errNilContext = fmt.Errorf("%w: redlock: nil context", dlock.ErrInvalidOption)

// List returns the locks whose key starts with prefix that a majority of
// nodes hold for the same owner (SCAN on every node; for operators). It
// returns by ctx's deadline even when nodes do not answer: those count as
// failed, and without a majority of answers the error wraps
// dlock.ErrUnavailable.
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	if ctx == nil { // checked before any goroutine gets it
		return nil, errNilContext
	}
	b := l.b
	if b.err != nil {
		return nil, b.err
	}
	type kv struct{ key, owner string }
	type listed struct {
		i     int
		infos []redisproto.Info
		err   error
	}
	ch := make(chan listed, len(b.nodes)) // buffered: a node answering late never blocks
	for i, n := range b.nodes {
		background.Go(func() {
			infos, err := n.List(ctx, prefix)
			ch <- listed{i, infos, err}
		})
	}
	// Every node is waited for until ctx ends (a default go-redis client
	// on a stalled link would wait for its own timeouts); a node that has
	// not answered by then counts as failed.
	agg := map[kv]*Info{}
	answered := make([]bool, len(b.nodes))
	var nerrs []error
	expired := false
	for got := 0; got < len(b.nodes) && !expired; {
		select {
		case r := <-ch:
			got++
			answered[r.i] = true
			if r.err != nil {
				nerrs = append(nerrs, fmt.Errorf("%s: %w", b.nodes[r.i].name, r.err))
				continue
			}
			for _, in := range r.infos {
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
		case <-ctx.Done():
			expired = true
			for i, ok := range answered {
				if !ok {
					nerrs = append(nerrs, fmt.Errorf("%w: %s: no answer before the context ended: %w", dlock.ErrUnavailable, b.nodes[i].name, context.Cause(ctx)))
				}
			}
		}
	}
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
