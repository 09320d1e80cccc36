package redlock

import (
	"sync/atomic"
	"time"
)

// ProposalLead is how far ahead of the nodes' clocks, as last measured,
// and of the round trip that measure took, an acquisition proposes its
// token. A node records the proposal as the token when it is above the
// node's floor, max(counter, server time in µs), and at most
// redisproto.MaxProposalLead (1s) ahead of its time: the lead covers the
// differences between the nodes' clocks and between round trips.
const ProposalLead = 100 * time.Millisecond

// measureLife is how long a measure of the nodes' clocks is used: an
// attempt after that proposes nothing (and measures again).
const measureLife = time.Minute

// maxProposal bounds proposals below 2^53, the largest token the scripts
// take (a Lua number is a double).
const maxProposal = 1<<53 - 1

// proposer picks the token an acquisition proposes in its grants, so that
// a majority recording it makes the token durable in the grant's round
// trip, with no commit round (see docs/redlock.md, Fencing token).
//
// Proposals follow the nodes' clocks, never the client's wall clock: each
// grant reply carries the node's time, and a proposal is the latest
// measure of a majority's time (the quorum-th latest of the granting
// nodes' clocks, so that one node whose clock is ahead does not lead),
// moved on by the client's monotonic clock since, plus the round trip of
// that measure and ProposalLead (a node's time when it runs the grant is
// at most a round trip past what the client can know of it). So a token
// is never more than that lead ahead of a majority's clocks (while they
// do not step back), whatever the client's clock does, and the nodes
// refuse to record one more than redisproto.MaxProposalLead ahead: once a
// key's counter has expired (its retention), the nodes' clocks are above
// every token it gave. Before a first measure, or once the last is older
// than measureLife, an attempt proposes nothing.
type proposer struct {
	m atomic.Pointer[clockMeasure]
}

// clockMeasure: the nodes' time, µs, as of at (read on the monotonic
// clock), and the round trip of the grant round that measured it.
type clockMeasure struct {
	node int64
	at   time.Time
	rtt  time.Duration
}

// next returns the proposal for an attempt starting now, or 0 (propose
// nothing: the attempt commits).
func (p *proposer) next() uint64 {
	m := p.m.Load()
	if m == nil {
		return 0
	}
	since := time.Since(m.at)
	if since < 0 || since > measureLife {
		return 0
	}
	v := m.node + (since + m.rtt + ProposalLead).Microseconds()
	if v <= 0 || v > maxProposal {
		return 0
	}
	return uint64(v)
}

// measure records a majority's time as of at (each node's reply time
// moved on by the time since its reply arrived) and the round trip of
// the round.
func (p *proposer) measure(node int64, at time.Time, rtt time.Duration) {
	if node > 0 {
		p.m.Store(&clockMeasure{node: node, at: at, rtt: rtt})
	}
}
