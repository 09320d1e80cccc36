package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

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
