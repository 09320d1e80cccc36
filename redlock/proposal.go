package redlock

import (
	"sync/atomic"
	"time"
)

// ProposalLead is how far ahead of the nodes' clocks, as last measured,
// an acquisition proposes its token. A node records the proposal as the
// token when it is above the node's floor, max(counter, server time in
// µs): the lead covers the round trip and the differences between the
// nodes' clocks.
const ProposalLead = 100 * time.Millisecond

// maxProposal bounds proposals below 2^53, the largest token the scripts
// take (a Lua number is a double).
const maxProposal = 1<<53 - 1

// proposer picks the token an acquisition proposes in its grants, so that
// a majority recording it makes the token durable in the grant's round
// trip, with no commit round (see docs/redlock.md, Fencing token).
//
// Proposals follow the nodes' clocks, not the client's: each grant reply
// carries the node's time, and the proposer keeps how far the nodes were
// ahead of this clock. Until one reply has been measured it proposes
// nothing, so a client whose clock is wrong never pushes tokens ahead of
// the nodes' clocks.
type proposer struct {
	// clock is the client's clock in µs; nil: time.Now.
	clock func() int64
	// last is the highest token this backend issued: proposals are
	// above it.
	last atomic.Uint64
	// offset is how far (µs) the nodes' clocks were ahead of this one in
	// the last measured grant round, the furthest node's; set once
	// measured is.
	offset   atomic.Int64
	measured atomic.Bool
}

func (p *proposer) now() int64 {
	if p.clock != nil {
		return p.clock()
	}
	return time.Now().UnixMicro()
}

// next returns the proposal for an attempt starting now, or 0 (propose
// nothing: the attempt commits) before a measure, or when it would be
// 2^53 or more.
func (p *proposer) next() uint64 {
	if !p.measured.Load() {
		return 0
	}
	v := max(uint64(max(p.now()+p.offset.Load()+ProposalLead.Microseconds(), 0)), p.last.Load()+1)
	if v > maxProposal {
		return 0
	}
	return v
}

// measure records the nodes' clocks' offset from this one, the largest
// among the granting nodes of a round (each node's time minus this
// clock as its reply arrived).
func (p *proposer) measure(offset int64) {
	p.offset.Store(offset)
	p.measured.Store(true)
}

// issued records a token returned to the caller.
func (p *proposer) issued(tok uint64) {
	for {
		cur := p.last.Load()
		if tok <= cur || p.last.CompareAndSwap(cur, tok) {
			return
		}
	}
}
