package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

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
// failing nodes alone make a majority impossible it is returned without
// either. Whenever the nodes that refused or reset the connection or did
// not answer in time are enough on their own to make a majority
// impossible, the error wraps dlock.ErrUnavailable as well (beside
// dlock.ErrTransient when some of them were merely silent). A failed
// release wraps it with dlock.ErrNotHeld when a majority said the lease
// was gone, else with dlock.ErrUnavailable (neither a majority released
// nor a majority gone: whether the lock was held up to the release is
// unknown, e.g. a node hung while another had not yet seen the lease's
// grant; the lease expires where it is left).
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

// outage reports whether the nodes that could not be reached (a refused
// or reset connection: driver.Unreachable) or did not answer in time are
// enough on their own to make a majority impossible: the operation failed
// because the service was out of reach, and the error wraps
// dlock.ErrUnavailable.
func (e *QuorumError) outage() bool {
	n := 0
	for _, r := range e.Results {
		if r.Outcome == OutcomeNoAnswer || r.Outcome == OutcomeFailed && driver.Unreachable(r.Err) {
			n++
		}
	}
	return n > len(e.Results)-e.Quorum
}

// unavailable is err, wrapping dlock.ErrUnavailable too when qe is an
// outage.
func unavailable(qe *QuorumError, err error) error {
	if qe.outage() {
		return dlock.Unavailable(err)
	}
	return err
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
	// at is when a grant's reply arrived (its o.Now is the node's time
	// then, less the reply's way back).
	at time.Time
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
		drain(ch, take) // answers already in count
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

// drain takes every answer already in ch, without waiting for more.
func drain(ch <-chan answer, take func(answer)) {
	for drained := false; !drained; {
		select {
		case a := <-ch:
			take(a)
		default:
			drained = true
		}
	}
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

// quorumLoss turns a refresh or release that missed its majority into an
// error wrapping dlock.ErrNotHeld when the nodes themselves said the lease
// is gone from a majority-breaking number of them; otherwise a refresh's
// is a transient quorum error, and a release's wraps dlock.ErrUnavailable.
func (b *backend) quorumLoss(op, key string, seen map[int]answer) error {
	qe := &QuorumError{Op: op, Key: key, Quorum: b.quorum, Results: b.results(op, seen, b.all())}
	if qe.count(OutcomeGone) > len(b.nodes)-b.quorum {
		return fmt.Errorf("%w: %w", dlock.ErrNotHeld, qe)
	}
	if op == "release" {
		// Neither released on a majority nor gone from one: whether the
		// lock was still held up to the release is unknown.
		return dlock.Unavailable(qe)
	}
	return unavailable(qe, qe)
}
