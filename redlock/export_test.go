package redlock

import (
	"context"
	"time"
)

// SetSettleHook makes f run as every Settle begins to wait (the grace
// after a majority released), with the caller's context, until the test
// ends.
func SetSettleHook(t interface{ Cleanup(func()) }, f func(ctx context.Context)) {
	settleHook.Store(&f)
	t.Cleanup(func() { settleHook.Store(nil) })
}

// SetEndlessGrace makes Settle's grace never run out until the test
// ends: Settle then returns when every node has answered or ctx ends.
func SetEndlessGrace(t interface{ Cleanup(func()) }) {
	endlessGrace.Store(true)
	t.Cleanup(func() { endlessGrace.Store(false) })
}

// SetGrantHook makes before run as a phase-one grant request to node i of
// l is about to be sent, and after once that node has answered it, until
// the test ends.
func SetGrantHook(t interface{ Cleanup(func()) }, l *Locker, i int, before, after func()) {
	target := l.b.nodes[i]
	f := func(n *node) func() {
		if n != target {
			return nil
		}
		before()
		return after
	}
	grantHook.Store(&f)
	t.Cleanup(func() { grantHook.Store(nil) })
}

// SetGrantHooks makes f run as a phase-one grant request to each node of
// l is about to be sent, with the node's index; the function f returns
// (if any) runs once that node has answered, before the attempt sees the
// answer. Until the test ends; the hook is the package's, so a test that
// sets it must not run in parallel.
func SetGrantHooks(t interface{ Cleanup(func()) }, l *Locker, f func(i int) (after func())) {
	g := func(n *node) func() {
		for i, m := range l.b.nodes {
			if m == n {
				return f(i)
			}
		}
		return nil
	}
	grantHook.Store(&g)
	t.Cleanup(func() { grantHook.Store(nil) })
}

// SetBreakCheckHook makes f run after each check a break notice (or the
// subscriptions being in place) triggers in a held lock, with the number
// of nodes found holding the lease, silent or not heard from when the
// check stopped (it stops once a majority is seen holding), until the
// test ends.
func SetBreakCheckHook(t interface{ Cleanup(func()) }, f func(held int)) {
	breakCheckHook.Store(&f)
	t.Cleanup(func() { breakCheckHook.Store(nil) })
}

// CommitEveryToken makes l's attempts propose no token, so that each goes
// through the commit round. Call it before l is used.
func CommitEveryToken(l *Locker) { l.b.commitAlways = true }

// CommitRounds is the number of commit rounds l's attempts have run.
func CommitRounds(l *Locker) uint64 { return l.b.commitRounds.Load() }

// AgeClockMeasure makes l's last measure of the nodes' clocks d older.
func AgeClockMeasure(l *Locker, d time.Duration) {
	if m := l.b.tokens.m.Load(); m != nil {
		l.b.tokens.m.Store(&clockMeasure{node: m.node - d.Microseconds(), at: m.at.Add(-d), rtt: m.rtt})
	}
}

// RaiseClockMeasure makes l's last measure of the nodes' clocks d ahead
// of what it measured, so that its next proposal is d further above the
// nodes' floors (whatever the scheduling delays before it is sent).
func RaiseClockMeasure(l *Locker, d time.Duration) {
	if m := l.b.tokens.m.Load(); m != nil {
		l.b.tokens.m.Store(&clockMeasure{node: m.node + d.Microseconds(), at: m.at, rtt: m.rtt})
	}
}

// SetMaxProposalLead makes the nodes record l's proposals up to d ahead of
// their clocks. Call it before l is used.
func SetMaxProposalLead(l *Locker, d time.Duration) { l.b.maxLead = d }
