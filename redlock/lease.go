package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// lease is a lock held on a majority.
type lease struct {
	b          *backend
	key, owner string
	timeout    time.Duration

	mu       sync.Mutex
	token    uint64 // the committed quorum token; 0 until then
	released bool
	// The stragglers of the last successful Release: settled is closed
	// once every node has answered or its request ended (the node
	// timeout, or the client's read timeout on a stalled link); Settle
	// waits for it until graceEnd.
	settled  chan struct{}
	graceEnd time.Time
	// acquiring is closed once every node has answered the acquisition's
	// phase one or its request ended, and any grant that landed
	// after the lock was released has been released again; nil for a
	// lease that was not acquired here (Abort).
	acquiring chan struct{}
	// releases has, per node, the answer of the last Release (nil before
	// one): a straggling grant that node ran before that release needs
	// no release of its own.
	releases []nodeRelease
}

// nodeRelease is one node's answer to a Release: done is closed once it
// answered (or its request ended); ok says it released the lease, at
// the node's time then (µs).
type nodeRelease struct {
	done chan struct{}
	ok   bool
	at   int64
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
		ok, _, err := n.QuorumRelease(ctx, l.key, l.owner, tok, FenceRetention)
		return answer{ok: ok, err: err}
	})
	for range idx {
		<-ch
	}
}

// Refresh implements driver.Lease: compare-and-pexpire on every node; held
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

// Release implements driver.Lease: compare-and-release (and publish) on
// every node, including those that never answered the acquisition. A
// node released already (a retry after a lost reply or an error) counts
// as released: it keeps a marker with the lease's token.
func (l *lease) Release(ctx context.Context) error {
	releases := make([]nodeRelease, len(l.b.nodes))
	for i := range releases {
		releases[i].done = make(chan struct{})
	}
	l.mu.Lock()
	l.released = true
	l.releases = releases
	tok := l.token
	l.mu.Unlock()
	all := l.b.all()
	// Every node gets the release. Its requests must not end with the
	// caller's context (the core cancels it as soon as Release returns,
	// and a request still waiting for a connection would then never be
	// sent, leaving the lease on that node until it expires): a node that
	// has not answered when Release returns finishes within the node
	// timeout on its own.
	start := time.Now()
	ch := l.b.fanOut(context.WithoutCancel(ctx), l.timeout, all, func(ctx context.Context, n *node) answer {
		ok, at, err := n.QuorumRelease(ctx, l.key, l.owner, tok, FenceRetention)
		r := &releases[n.idx]
		r.ok, r.at = ok && err == nil, at
		close(r.done)
		return answer{ok: ok, err: err}
	})
	r := tally(ctx, ch, all, l.b.quorum, l.timeout)
	if !r.ok {
		return l.b.quorumLoss("release", l.key, r.seen)
	}
	// A majority released: the lock is released. The other nodes'
	// answers are collected in the background; Settle (called by the
	// engine with the caller's context) waits for them a grace in
	// proportion to what the majority took.
	elapsed := time.Since(start)
	grace := min(max(4*elapsed, releaseGraceMin), l.timeout-elapsed)
	settled := make(chan struct{})
	l.mu.Lock()
	l.settled, l.graceEnd = settled, time.Now().Add(grace)
	l.mu.Unlock()
	rest := len(all) - r.received
	background.Go(func() {
		for range rest {
			<-ch // each bounded by the node timeout (fanOut)
		}
		close(settled)
	})
	return nil
}

// Settle implements driver.Settler: it waits, within ctx and the grace
// the last Release set (4× what its majority took, at least
// releaseGraceMin, within the node timeout), for the nodes that had not
// answered that Release, and for the acquisition's grants still in flight
// (a grant that lands on a node after that node answered the release is
// released there again), so that a List or Break right after Release
// does not find the lease on a node that was merely a little slower. A
// hung node costs the grace (or ctx), never the release.
func (l *lease) Settle(ctx context.Context) {
	l.mu.Lock()
	settled, end := l.settled, l.graceEnd
	l.mu.Unlock()
	if settled == nil {
		return
	}
	acquiring := l.acquiring // nil: nothing to wait for
	if hook := settleHook.Load(); hook != nil {
		(*hook)(ctx)
	}
	var expired <-chan time.Time
	if !endlessGrace.Load() {
		t := time.NewTimer(time.Until(end))
		defer t.Stop()
		expired = t.C
	}
	for settled != nil || acquiring != nil {
		select {
		case <-settled:
			settled = nil
		case <-acquiring:
			acquiring = nil
		case <-expired:
			return
		case <-ctx.Done():
			return
		}
	}
}

// settleHook, when set (by tests), runs as Settle begins to wait, with
// the caller's context.
var settleHook atomic.Pointer[func(ctx context.Context)]

// endlessGrace, set by tests, makes Settle's grace never run out.
var endlessGrace atomic.Bool

// releaseGraceMin is the least time Release waits, after a majority
// released, for the other nodes' answers.
const releaseGraceMin = 20 * time.Millisecond

// RefreshBatch implements driver.BatchRenewer: one pipeline per node for all
// due leases, the nodes in parallel. Each renewal is reported as soon as a
// majority of nodes extended it (or a majority can no longer do so): a
// slow or hung minority delays nothing. A node that has not answered
// within the node timeout counts as failed, and a node whose previous
// renewal pipeline is still running is not sent another one (it counts as
// not answering), so renewals do not pile up on a hung node.
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
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

// breakListenDelay is how long a lock is held before it listens for break
// notices. Most locks are held for less: they cost no subscription, and a
// break of one is found by its release or renewal.
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, the lease listens on its key's break channel on every
// node (a break publishes on each node it removed the lease from), and on
// each notice asks every node, within the node timeout, whether it still
// holds the lease: when the nodes that do, with those that did not
// answer, are fewer than a majority, the lease can no longer be valid
// and the Lock is lost (wrapping dlock.ErrNotHeld) within two node
// timeouts and a round trip of the notice, not at its next renewal. It
// also asks once when the subscriptions are in place, which covers a break
// before them. A node whose SUBSCRIBE fails (down) is not listened to for
// the rest of the lock's life: a break that reaches no other listened node
// is found by the next renewal. stop cancels the listening without waiting
// on the network.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	// Not background work: it lasts as long as the lock (or the clients).
	t := time.AfterFunc(breakListenDelay, func() {
		if ctx.Err() == nil { // not stopped meanwhile
			go l.listenBreaks(ctx, lose)
		}
	})
	return func() {
		t.Stop()
		cancel()
	}
}

// listenBreaks is Bind's listener, until ctx ends or the lock is lost.
func (l *lease) listenBreaks(ctx context.Context, lose func(cause error)) {
	ch := make(chan struct{}, 1)
	subs := make(chan *redisproto.Subscription, len(l.b.nodes))
	var wg sync.WaitGroup
	for _, n := range l.b.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s, err := n.WatchBreaks(ctx, l.key, ch); err == nil {
				subs <- s
			}
		}()
	}
	wg.Wait()
	close(subs)
	listening := 0
	for s := range subs {
		defer s.Close()
		listening++
	}
	if listening == 0 {
		return // no node listens: the renewals find a break
	}
	select {
	case ch <- struct{}{}: // a break before the subscriptions
	default: // a notice is already pending
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		held, asked := l.heldOn(ctx)
		if hook := breakCheckHook.Load(); hook != nil {
			(*hook)(held)
		}
		if held < l.b.quorum && ctx.Err() == nil {
			lose(fmt.Errorf("%w: redlock %q: the lease is on %d of %d nodes, or not known to be, after a break (%d needed)", dlock.ErrNotHeld, l.key, held, asked, l.b.quorum))
			return
		}
		// The lease is still on a majority. Notices come in bursts too (a
		// down node's subscription signals each attempt to reconnect): the
		// next check waits a node timeout, so a lock costs at most one
		// read per node per node timeout, and a break is still found
		// within two node timeouts.
		pause := time.NewTimer(l.timeout)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
	}
}

// heldOn asks every node, each within the node timeout, whether it holds
// the lease: held counts those that do and those that did not answer
// (they may), of asked. It returns once the answers show fewer than a
// majority, or a majority holding it, or every node answered, or the node
// timeout passed.
func (l *lease) heldOn(ctx context.Context) (held, asked int) {
	all := l.b.all()
	ch := l.b.fanOut(ctx, l.timeout, all, func(ctx context.Context, n *node) answer {
		ok, err := n.Holds(ctx, l.key, l.owner, false)
		return answer{ok: ok, err: err}
	})
	// The node timeout bounds the wait itself: a client on a stalled link
	// may not give up by its context (see tally).
	timer := time.NewTimer(l.timeout)
	defer timer.Stop()
	gone, holding := 0, 0
	take := func(a answer) {
		switch {
		case a.ok:
			holding++
		case a.err == nil:
			gone++
		}
	}
	for n := 0; n < len(all) && len(all)-gone >= l.b.quorum && holding < l.b.quorum; n++ {
		select {
		case a := <-ch:
			take(a)
		case <-timer.C:
			// The answers already in count; the rest are silent.
			drain(ch, take)
			return len(all) - gone, len(all)
		case <-ctx.Done():
			return len(all) - gone, len(all)
		}
	}
	return len(all) - gone, len(all)
}

// breakCheckHook, when set (by tests), runs after each check a break
// notice triggers, with the nodes found holding the lease (or silent).
var breakCheckHook atomic.Pointer[func(held int)]
