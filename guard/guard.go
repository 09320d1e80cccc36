package guard

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/observe"
)

// Guard is what every guard offers: fenced Put and Get of named values
// kept per resource, and the resource's highest accepted fence.
//
// Resources and names are 1 to dlock.MaxKeyLen bytes of valid UTF-8
// without NUL, like lock keys; values are any bytes. Each resource has its
// own highest fence and its own names: no resource or name is a prefix of
// another as far as the guard is concerned.
type Guard interface {
	// Highest returns the highest fence resource has accepted: the last
	// admitted exclusive fence (Shared false), or the zero Fence if none.
	Highest(ctx context.Context, resource string) (dlock.Fence, error)
	// Put sets name to value in resource if f is admitted (see the
	// package's rule), recording f as the highest fence when it is
	// exclusive. A refused fence returns a *dlock.StaleTokenError and
	// writes nothing.
	Put(ctx context.Context, resource string, f dlock.Fence, name, value string) error
	// Get reads name in resource if f is admitted, and records f exactly
	// as Put does: a fenced read, so an older holder's later Put is
	// refused. ok is false (with a nil error) when name was never Put.
	// A refused fence returns a *dlock.StaleTokenError.
	Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error)
}

// Doer is implemented by guards that can run arbitrary code under the
// fence check: those whose resource is in the guard's process or host
// (Memory, filelock.Guard).
type Doer interface {
	// Do runs fn if f is admitted for resource, recording f as Put does,
	// with no other admitted operation (Do, Put, Get) on the same resource
	// running at the same time. A refused fence returns a
	// *dlock.StaleTokenError without running fn. fn's error is returned as
	// is; the fence stays recorded even if fn fails. Waiting for another
	// operation on the resource is bounded by ctx. fn must not call the
	// guard for the same resource (it would wait for itself). A nil fn is
	// an error wrapping dlock.ErrInvalidOption.
	Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context) error) error
}

// Checker is the part of a guard every implementation shares: argument
// checks, the admission rule (dlock.FenceRecord.Admit), and the refusal: the
// *dlock.StaleTokenError and the dlock.EventRejected reported to the
// guard's Observer. The zero Checker has no backend name and no Observer.
// A Checker is a small value, safe for concurrent use.
type Checker struct {
	backend string
	obs     dlock.Observer
}

// NewChecker returns the Checker of a guard of backend ("memory", "file",
// "redis", ...), which names the guard in errors and in Event.Backend.
// opts are the guard constructor's options: the Checker reports refusals
// to the Observer set among them with dlock.WithObserver (none: no
// reports); other options are ignored.
func NewChecker(backend string, opts []driver.Option) Checker {
	o, _ := observe.Of(opts).(dlock.Observer)
	return Checker{backend: backend, obs: o}
}

// Backend returns the backend name given to NewChecker.
func (c Checker) Backend() string { return c.backend }

// Validate checks the arguments of a guard call, in this order: a nil ctx
// (an error wrapping dlock.ErrInvalidOption), then resource and each of
// names (1 to dlock.MaxKeyLen bytes of valid UTF-8 without NUL; errors
// wrap dlock.ErrInvalidKey), then ctx having ended (ctx.Err()). A guard
// calls it first and does nothing else when it fails.
func (c Checker) Validate(ctx context.Context, resource string, names ...string) error {
	if ctx == nil {
		return fmt.Errorf("%w: %s guard: nil context", dlock.ErrInvalidOption, c.backend)
	}
	if err := dlock.ValidateKey(resource); err != nil {
		return fmt.Errorf("%s guard: resource: %w", c.backend, err)
	}
	for _, n := range names {
		if err := dlock.ValidateKey(n); err != nil {
			return fmt.Errorf("%s guard: name: %w", c.backend, err)
		}
	}
	return ctx.Err()
}

// MaxOwnerLen is the longest Fence.Owner a guard accepts, in bytes: room
// for any owner a lock hands out (dlock.NewOwner's are 32 hex digits)
// while every guard's request stays within its store's limits.
const MaxOwnerLen = 1024

// ValidateFence checks the fence of a guard call: an owner over
// MaxOwnerLen bytes is an error wrapping dlock.ErrInvalidOption. A guard
// calls it with Validate, before any I/O; the token is the rule's
// business (token 0 is refused as stale).
func (c Checker) ValidateFence(f dlock.Fence) error {
	if len(f.Owner) > MaxOwnerLen {
		return fmt.Errorf("%w: %s guard: a fence owner of %d bytes is over guard.MaxOwnerLen (%d)", dlock.ErrInvalidOption, c.backend, len(f.Owner), MaxOwnerLen)
	}
	return nil
}

// Check applies the rule to f for resource, whose record is rec.
// Admitted, it returns the record to keep afterwards (the guard writes it
// when it differs from rec) and a nil error. Refused, it returns rec and
// the error of Refuse, which it reports.
func (c Checker) Check(resource string, rec dlock.FenceRecord, f dlock.Fence) (next dlock.FenceRecord, err error) {
	next, ok := rec.Admit(f)
	if !ok {
		return rec, c.Refuse(resource, f, rec.Bar(f))
	}
	return next, nil
}

// Refuse is the refusal of f for resource, where highest is the token f
// had to reach (dlock.FenceRecord.Bar): it reports one dlock.EventRejected (Backend, Key: resource,
// Token, Owner, Highest; Mode dlock.Shared for a shared fence) to the
// Observer and returns the *dlock.StaleTokenError (wrapping
// dlock.ErrStaleToken). Guards whose store applies the rule itself (a
// Lua script, a transaction) call it when the store refused; others call
// Check.
func (c Checker) Refuse(resource string, f dlock.Fence, highest uint64) error {
	if c.obs != nil {
		mode := dlock.Exclusive
		if f.Shared {
			mode = dlock.Shared
		}
		c.obs.Observe(dlock.Event{
			Kind:    dlock.EventRejected,
			Backend: c.backend,
			Key:     resource,
			Mode:    mode,
			Token:   f.Token,
			Owner:   f.Owner,
			Highest: highest,
		})
	}
	return &dlock.StaleTokenError{Resource: resource, Token: f.Token, Owner: f.Owner, Highest: highest}
}
