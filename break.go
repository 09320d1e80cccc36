package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dlock-go/dlock/driver"
)

// ErrNotHolder: an owner-checked Break named an owner that does not hold
// the key. The key is left as it was. See *NotHolderError.
var ErrNotHolder = errors.New("dlock: not the holder")

// NotHolderError is returned by an owner-checked Break when the owner
// holds nothing on the key. It unwraps to ErrNotHolder.
type NotHolderError struct {
	Key   string
	Owner string
	// Holders are the key's actual holders, untouched (none for a free
	// key).
	Holders []Holder
}

func (e *NotHolderError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock: lock %q is not held by owner %s", e.Key, e.Owner)
	switch len(e.Holders) {
	case 0:
		b.WriteString(": the key is free")
	default:
		b.WriteString(": held by ")
		for i, h := range e.Holders {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(h.String())
			if h.Token != 0 {
				fmt.Fprintf(&b, " token %d", h.Token)
			}
		}
	}
	return b.String()
}

// Unwrap returns ErrNotHolder.
func (e *NotHolderError) Unwrap() error { return ErrNotHolder }

// Broken is what Break removed.
type Broken struct {
	Key string
	// Holders are the leases removed, one per holder, oldest grant first
	// (none when the key was free).
	Holders []Holder
	// Nodes, for a multi-node backend (Redlock), lists every removal by
	// node: a holder appears once per node its lease was on.
	Nodes []BrokenOnNode
	// NodeErrors, for a multi-node backend, are the nodes that failed or
	// did not answer (each error names its node) although enough others
	// answered for the break to count: their copies of the leases expire
	// with their TTL.
	NodeErrors []error
}

// BrokenOnNode is one lease removed from one node of a multi-node backend.
type BrokenOnNode struct {
	Node   string
	Holder Holder
}

// Breaker is implemented by the Lockers of backends that can break a lock
// on an operator's behalf. Use it through Break.
type Breaker interface {
	Break(ctx context.Context, key, owner string) (Broken, error)
}

var _ Breaker = (*Engine)(nil)

// Break removes key's leases on l's backend, on an operator's behalf (a
// stuck holder, `dlock unlock`).
//
// With owner == "" it breaks the lock: every lease that holds key is
// removed (the exclusive holder, or all Shared or Limited holders). With
// an owner id (Lock.Owner, Holder.Owner; 32 hex digits) only that owner's
// lease is removed, and if that owner holds nothing on key the error is a
// *NotHolderError (wrapping ErrNotHolder) naming the actual holders, and
// nothing changes.
//
// Breaking a free key is not an error: Broken.Holders is empty. Waiters are
// not removed: they are woken as by a release. The key's fencing counter is
// untouched, so the next holder's token is above every broken one's, and
// guards keep refusing the broken holder's writes once the next holder has
// written.
//
// A broken holder's Lock finds out at once where the backend can tell it
// (memlock, Redis, etcd, ZooKeeper, PostgreSQL with LISTEN, file locks:
// Lost() closes with LossBackend within a few round trips; Redlock within
// two node timeouts and a round trip), and at
// its next renewal at the latest elsewhere (Lost() closes with
// LossNotHeld); its Release then returns an error wrapping ErrLockLost.
//
// Backends without the capability return ErrUnsupported.
func Break(ctx context.Context, l Locker, key, owner string) (Broken, error) {
	if l == nil {
		return Broken{}, fmt.Errorf("%w: nil Locker", ErrNilClient)
	}
	if ctx == nil {
		return Broken{}, errNilContext
	}
	b, ok := l.(Breaker)
	if !ok {
		return Broken{}, fmt.Errorf("%w: breaking a lock (%T has no Break)", ErrUnsupported, l)
	}
	return b.Break(ctx, key, owner)
}

// ValidateOwner checks an owner id for Break: 32 hex digits (what NewOwner
// returns), or "" for any holder. It returns the id in lower case.
func ValidateOwner(owner string) (string, error) {
	if owner == "" {
		return "", nil
	}
	if len(owner) != 32 {
		return "", fmt.Errorf("%w: owner id %q is not 32 hex digits", ErrInvalidOption, truncate(owner, 40))
	}
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return "", fmt.Errorf("%w: owner id %q is not 32 hex digits", ErrInvalidOption, truncate(owner, 40))
		}
	}
	return strings.ToLower(owner), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Break implements Breaker over a driver.Breaker: ErrUnsupported when the
// driver has none. The call returns by ctx's end like every driver call
// (ErrUnavailable when the backend gave no answer; the break may then
// still take effect).
func (e *Engine) Break(ctx context.Context, key, owner string) (Broken, error) {
	if err := e.check(ctx); err != nil {
		return Broken{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Broken{}, err
	}
	owner, err := ValidateOwner(owner)
	if err != nil {
		return Broken{}, err
	}
	br, ok := e.drv.(driver.Breaker)
	if !ok {
		return Broken{}, fmt.Errorf("%w: the %s backend cannot break locks", ErrUnsupported, e.spec.Name)
	}
	res, err, abandoned := call(ctx, func(ctx context.Context) (driver.BreakResult, error) {
		return br.Break(ctx, key, owner)
	}, nil)
	if abandoned {
		return Broken{Key: key}, fmt.Errorf("%w: break %q: no answer before the context ended: %w", ErrUnavailable, key, ctxErr(ctx))
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrUnavailable) {
			// The driver's own call ended with the context (a deadline
			// it passed on, as against a paused server): no answer, as
			// above.
			err = errors.Join(fmt.Errorf("%w: break %q: %w", ErrUnavailable, key, err), ctxErr(ctx))
		}
		return Broken{Key: key}, err
	}
	out := Broken{Key: key, NodeErrors: res.NodeErrs}
	seen := map[string]bool{}
	multi := false
	for _, h := range res.Removed {
		if h.Node != "" {
			multi = true
		}
	}
	for _, h := range res.Removed {
		pub := heldPublic(h)
		if multi {
			out.Nodes = append(out.Nodes, BrokenOnNode{Node: h.Node, Holder: pub})
		}
		id := fmt.Sprintf("%s/%d", h.Owner, h.Token)
		if seen[id] {
			continue
		}
		seen[id] = true
		out.Holders = append(out.Holders, pub)
	}
	sortHolders(out.Holders)
	if owner != "" && len(out.Holders) == 0 {
		ne := &NotHolderError{Key: key, Owner: owner}
		seen := map[string]bool{}
		for _, h := range res.Others {
			id := fmt.Sprintf("%s/%d", h.Owner, h.Token)
			if seen[id] {
				continue
			}
			seen[id] = true
			ne.Holders = append(ne.Holders, heldPublic(h))
		}
		sortHolders(ne.Holders)
		return out, ne
	}
	return out, nil
}

func heldPublic(h driver.Held) Holder {
	return Holder{Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: Mode(h.Mode)}
}

func sortHolders(hs []Holder) {
	slices.SortStableFunc(hs, func(a, b Holder) int { return cmp.Compare(a.Token, b.Token) })
}
