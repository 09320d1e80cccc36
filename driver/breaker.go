package driver

import (
	"context"
	"time"
)

// Breaker is implemented by drivers that can remove a key's leases on an
// operator's behalf (dlock.Break, `dlock unlock`).
//
// With owner == "" (a forced break) Break removes every lease that holds
// key: the exclusive holder, or every Shared or Limited holder. With an
// owner, it removes that owner's lease only (for a Shared or Limited key,
// that holder alone) and leaves the others. Either way it does not touch
// waiters (queue entries, waiting-writer registrations): they are woken,
// as by a release, and compete for the key as usual.
//
// A break is atomic per key (one script, one transaction, a
// compare-and-delete on the exact lease it read), so it never removes a
// lease granted after the holders it reports were read. It never lowers or
// resets the key's token counter: the next grant's token is above every
// broken one's. The broken holders find out at their next renewal (the
// lease is gone: dlock.ErrNotHeld) or earlier where the backend notices
// deletions.
type Breaker interface {
	// Break removes key's leases as above. It returns what it removed and,
	// when an owner was given and holds nothing on key, no removal and
	// the key's current holders in BreakResult.Others (so the error can
	// name them). A free key is not an error: both lists are empty.
	Break(ctx context.Context, key, owner string) (BreakResult, error)
}

// BreakResult is what a Breaker did.
type BreakResult struct {
	// Removed are the leases removed. A multi-node backend (Redlock)
	// reports one entry per node it removed a lease on, with Node set.
	Removed []Held
	// Others are the holders left in place because they are not the owner
	// asked for (only when that owner held nothing).
	Others []Held
	// NodeErrs, for a multi-node backend, are the failures of the nodes
	// that did not answer, each naming its node, when enough others did
	// for the break to count (a Redlock majority).
	NodeErrs []error
}

// Held is one lease as a Breaker saw it: the fields of dlock.Holder, and
// the node for a multi-node backend. Fields a backend does not know are
// zero.
type Held struct {
	Owner    string
	Token    uint64
	Metadata map[string]string
	// TTL is the time that was left on the lease.
	TTL  time.Duration
	Mode Mode
	// Node names the server the lease was on ("" for a single service).
	Node string
}
