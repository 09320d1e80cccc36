package redlock

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Try implements driver.Driver: phase one grants on a majority and
// proposes a token; when a majority records the proposal it is the token.
// Otherwise phase two commits the quorum token (the highest floor + 1) on
// the granting majority.
//
// The lock's validity, TTL − elapsed − drift, is the engine's to enforce:
// it counts the lock's local deadline from the start of the attempt, before
// phase one, and refuses (and releases) a grant that arrives with none
// left, with an error wrapping dlock.ErrTransient. The drift allowance is
// the caller's (dlock.WithDrift) and the driver does not see it, so Try
// itself only gives up on a grant whose whole TTL has run out: it skips
// the commit and reports which nodes granted.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	start := time.Now()
	meta, err := redisproto.EncodeMetadata(req.Metadata)
	if err != nil {
		return driver.Grant{}, err
	}
	timeout := b.timeout(req.TTL)
	if err := b.checkEviction(ctx, timeout); err != nil {
		return driver.Grant{}, err
	}
	lease := &lease{b: b, key: req.Key, owner: req.Owner, timeout: timeout, acquiring: make(chan struct{})}
	all := b.all()
	retention := req.TTL + FenceRetention
	prop := redisproto.Proposal{Token: b.proposal(), Retention: retention, MaxLead: b.maxLead}
	sent := time.Now()
	ch := b.fanOut(ctx, timeout, all, func(ctx context.Context, n *node) answer {
		defer b.waiters.Begin(req.WaitID)() // may queue the waiter
		if hook := grantHook.Load(); hook != nil {
			if after := (*hook)(n); after != nil {
				defer after()
			}
		}
		o, err := n.Grant(ctx, req.Key, req.Owner, req.TTL, meta, req.WaitID, waitScore(req.WaitID), prop)
		return answer{ok: err == nil && o.Granted, o: o, err: err, at: time.Now()}
	})
	r := tally(ctx, ch, all, b.quorum, timeout)
	if !r.ok {
		r = settle(ctx, ch, r, len(all), b.quorum, start.Add(timeout))
	}
	// Stragglers may still grant: release them if this attempt fails or the
	// lock is released before they answer.
	background.Go(func() {
		defer close(lease.acquiring)
		lease.finish(ch, len(all)-r.received, !r.ok)
	})
	if !r.ok {
		lease.cleanup(r.seen)
		return driver.Grant{}, b.acquireError(req.Key, r.seen)
	}
	var (
		granted   []int
		floor     uint64
		recorded  int
		nodeTimes []int64 // the granting nodes' times as of now, µs
		rtt       time.Duration
	)
	now := time.Now()
	for _, i := range all {
		if a := r.seen[i]; a.ok {
			if a.o.Now > 0 {
				nodeTimes = append(nodeTimes, a.o.Now+now.Sub(a.at).Microseconds())
				rtt = max(rtt, a.at.Sub(sent))
			}
			granted = append(granted, i)
			floor = max(floor, a.o.Token)
			if a.o.Recorded {
				recorded++
			}
		}
	}
	if len(nodeTimes) >= b.quorum {
		// The quorum-th latest clock: a majority's, which one node
		// whose clock is ahead does not move.
		slices.Sort(nodeTimes)
		b.tokens.measure(nodeTimes[len(nodeTimes)-b.quorum], now, rtt)
	}
	if elapsed := time.Since(start); elapsed >= req.TTL {
		lease.cleanup(r.seen)
		return driver.Grant{}, b.noValidity(req.Key, r.seen, elapsed)
	}
	if prop.Token != 0 && recorded >= b.quorum {
		// The proposal is durable on a majority: each of those nodes
		// had a floor below it, and any majority that recorded an
		// earlier token overlaps this one.
		lease.mu.Lock()
		lease.token = prop.Token
		lease.mu.Unlock()
		return driver.Grant{Lease: lease, Token: prop.Token}, nil
	}
	tok := floor + 1
	if tok > maxProposal {
		lease.cleanup(r.seen)
		return driver.Grant{}, fmt.Errorf("dlock: redlock acquire %q: the nodes' token counter is at 2^53 or more: a larger token cannot be kept exactly; released", req.Key)
	}
	b.commitRounds.Add(1)
	// Phase two: make the token durable on a majority before using it.
	cch := b.fanOut(ctx, timeout, granted, func(ctx context.Context, n *node) answer {
		ok, err := n.Commit(ctx, req.Key, req.Owner, tok, meta, retention)
		return answer{ok: ok, err: err}
	})
	cr := tally(ctx, cch, granted, b.quorum, timeout)
	if !cr.ok {
		// A majority granted, so the key was free: a commit that missed
		// its majority (a node slow or failing, a lease that expired
		// meanwhile) may well succeed next time.
		lease.cleanup(r.seen)
		qe := &QuorumError{Op: "commit", Key: req.Key, Quorum: b.quorum,
			Reason:  "a majority granted, but the token could not be recorded on a majority; released",
			Results: b.results("commit", cr.seen, granted)}
		return driver.Grant{}, unavailable(qe, fmt.Errorf("%w: %w", dlock.ErrTransient, qe))
	}
	if elapsed := time.Since(start); elapsed >= req.TTL {
		lease.cleanup(r.seen)
		return driver.Grant{}, b.noValidity(req.Key, r.seen, elapsed)
	}
	lease.mu.Lock()
	lease.token = tok
	lease.mu.Unlock()
	return driver.Grant{Lease: lease, Token: tok}, nil
}

// proposal is the token an attempt proposes: 0 (none) when the Locker
// was set to commit every token.
func (b *backend) proposal() uint64 {
	if b.commitAlways {
		return 0
	}
	return b.tokens.next()
}

// grantHook, when set (by tests), runs before each phase-one grant request
// with its node; the function it returns (if any) runs once the node has
// answered.
var grantHook atomic.Pointer[func(n *node) (after func())]

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
// late grant if the attempt failed or the lock was released meanwhile,
// unless the node released it already: its answer to the lock's last
// Release says it released the lease at a time (the node's clock) after
// the grant ran. A grant that ran after that release (it overtook it on
// another connection, or the client sent it again after a lost reply) is
// released again.
func (l *lease) finish(ch <-chan answer, n int, failed bool) {
	for ; n > 0; n-- {
		a := <-ch
		if !a.ok && a.err == nil {
			continue
		}
		l.mu.Lock()
		gone := failed || l.released
		releases := l.releases
		l.mu.Unlock()
		if !gone {
			continue
		}
		if !failed && a.ok && a.o.Now > 0 && releases != nil && releasedAfter(&releases[a.i], a.o.Now, l.timeout) {
			continue
		}
		l.releaseOn([]int{a.i})
	}
}

// releasedAfter waits (at most timeout) for r and reports whether that
// release removed the lease after the node's time grantAt.
func releasedAfter(r *nodeRelease, grantAt int64, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		return r.ok && r.at > grantAt
	case <-t.C:
		return false
	}
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
// unreachable node may come back); either wraps dlock.ErrUnavailable when
// the nodes out of reach (refused, reset, silent) make a majority
// impossible on their own; otherwise the key is held somewhere → not
// acquired (the caller may wait).
func (b *backend) acquireError(key string, seen map[int]answer) error {
	qe := &QuorumError{Op: "acquire", Key: key, Quorum: b.quorum, Results: b.results("acquire", seen, b.all())}
	failed, silent := qe.count(OutcomeFailed), qe.count(OutcomeNoAnswer)
	switch {
	case failed > len(b.nodes)-b.quorum:
		qe.Reason = fmt.Sprintf("%d nodes failed: a majority is impossible", failed)
		return unavailable(qe, qe)
	case failed+silent > len(b.nodes)-b.quorum:
		qe.Reason = fmt.Sprintf("%d nodes failed or did not answer: a majority is impossible for now; released", failed+silent)
		return unavailable(qe, fmt.Errorf("%w: %w", dlock.ErrTransient, qe))
	}
	if n := splitVote(seen, len(b.nodes), b.quorum); n > 0 {
		// A split vote: no owner holds, or can hold, a majority, so
		// nobody holds the key (contenders still in phase one, perhaps
		// beside the last node of a holder whose release reached a
		// majority already). Each contender releases its minority at
		// once; a repeated attempt, after the caller's jittered backoff,
		// may win.
		qe.Reason = fmt.Sprintf("split vote: %d nodes hold other owners' minorities, none a majority; released", n)
		return fmt.Errorf("%w: %w", dlock.ErrTransient, qe)
	}
	// Otherwise at least one node said the key is held.
	return &dlock.NotAcquiredError{Key: key, Holders: holdersSeen(seen), Cause: qe}
}

// refusals sums up the refusing nodes of a phase one: how many refused,
// the most nodes any one owner (or reserved waiter) was seen on, and how
// many nodes failed or have not answered (any of them might be that
// owner's). real is set when a refusal names a shared or limited group or
// no owner at all: a holder whatever the counts.
type refusals struct {
	refusing, most, unknown int
	real                    bool
}

func countRefusals(seen map[int]answer, nodes int) refusals {
	r := refusals{unknown: nodes - len(seen)}
	per := map[string]int{}
	for _, a := range seen {
		switch {
		case a.ok:
			continue
		case a.err != nil || a.noAnswer:
			r.unknown++
			continue
		}
		id := "owner " + a.o.Holder.Owner
		switch {
		case a.o.ReservedFor != "":
			id = "waiter " + a.o.ReservedFor
		case a.o.Group != "" || a.o.Holder.Owner == "":
			r.real = true
		}
		per[id]++
		r.refusing++
		r.most = max(r.most, per[id])
	}
	return r
}

// undecided reports whether the answers so far cannot tell a holder from a
// split vote: no one owner was seen on a majority, but one could be on
// the nodes still to answer.
func (r refusals) undecided(quorum int) bool {
	return !r.real && r.refusing > 0 && r.most < quorum && r.most+r.unknown >= quorum
}

// splitVote counts the refusing nodes when no single owner (or reserved
// waiter) holds, or could hold, a majority: each one's refusals plus every
// node that failed or did not answer stay below quorum. It is 0 when some
// owner could (a holder, or a contender whose phase one reached a majority
// and will commit) or when a refusal names a shared or limited group or no
// owner. A committed holder, or a reservation, seen on a minority alone
// holds nothing: the holder's release reached the other nodes first (or
// its leases there expired or were lost); the reserved waiter lost the
// race on the others or has acquired and released already.
func splitVote(seen map[int]answer, nodes, quorum int) int {
	r := countRefusals(seen, nodes)
	if r.real || r.most+r.unknown >= quorum {
		return 0
	}
	return r.refusing
}

// settle goes on collecting phase-one answers from ch after tally found
// the attempt failed, while they cannot yet tell a holder from a split
// vote (tally stops at the first minority of refusals, and with five
// nodes three refusals from different owners leave two unknown), until
// deadline or ctx ends. It returns r with the answers taken.
func settle(ctx context.Context, ch <-chan answer, r tallied, nodes, quorum int, deadline time.Time) tallied {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for r.received < nodes && countRefusals(r.seen, nodes).undecided(quorum) {
		select {
		case a := <-ch:
			r.seen[a.i] = a
			r.received++
		case <-timer.C:
			return r
		case <-ctx.Done():
			return r
		}
	}
	return r
}

// holdersSeen lists the holders that the nodes refusing the key reported:
// one per owner (a reservation for a woken waiter counts as a holder
// without an owner, one per waiter), the one seen on most nodes first,
// each with the highest token and the shortest lease left it was seen
// with.
func holdersSeen(seen map[int]answer) []dlock.Holder {
	type seenHolder struct {
		h     dlock.Holder
		nodes int
	}
	by := map[string]*seenHolder{}
	for _, a := range seen {
		if a.err != nil || a.ok {
			continue
		}
		in := a.o.Holder
		id := in.Owner + "|" + in.Metadata[MetaReservedForWaiter]
		sh := by[id]
		if sh == nil {
			sh = &seenHolder{h: dlock.Holder{Owner: in.Owner, Metadata: in.Metadata, Mode: dlock.Exclusive}}
			by[id] = sh
		}
		sh.nodes++
		sh.h.Token = max(sh.h.Token, in.Token)
		if a.o.PTTL > 0 && (sh.h.TTL == 0 || a.o.PTTL < sh.h.TTL) {
			sh.h.TTL = a.o.PTTL
		}
	}
	ids := slices.Collect(maps.Keys(by))
	slices.SortFunc(ids, func(x, y string) int {
		if c := cmp.Compare(by[y].nodes, by[x].nodes); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	hs := make([]dlock.Holder, len(ids))
	for i, id := range ids {
		hs[i] = by[id].h
	}
	return hs
}

// Abort implements driver.Aborter: it releases req.Owner's lease on every
// node, for an attempt whose outcome is unknown.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	l := &lease{b: b, key: req.Key, owner: req.Owner, timeout: b.timeout(req.TTL)}
	return l.Release(ctx)
}
