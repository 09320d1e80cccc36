package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Every error returned by dlock and its backends wraps one
// of these where one applies; test for them with errors.Is.
var (
	// ErrNotAcquired: a holder was observed: the key is held by someone
	// else (TryAcquire), or Acquire gave up waiting for it (its context
	// ended or WithWait elapsed). It is never returned for a backend that
	// failed or did not answer: that is the backend's error or
	// ErrUnavailable.
	ErrNotAcquired = errors.New("dlock: lock not acquired")
	// ErrUnavailable: the lock service could not be reached or gave no
	// answer, so nothing is known about the key: it refused or reset the
	// connection (the network error is kept in the chain, so
	// errors.Is(err, syscall.ECONNREFUSED) holds), or did not answer
	// before the context ended (a hung server or a stalled link; the
	// context's error is joined to it). An attempt whose outcome is
	// unknown this way is undone in the background if it took effect
	// after all.
	ErrUnavailable = errors.New("dlock: lock service unavailable")
	// ErrTransient is wrapped by a backend's attempt that failed without
	// leaving anything behind, and that may succeed if repeated (a Redlock
	// commit that missed its majority, a grant that arrived with no
	// validity left, a queued waiter whose own lease or session expired).
	// Acquire repeats such attempts after a backoff step while it may
	// wait; TryAcquire returns the error.
	ErrTransient = errors.New("dlock: transient failure")
	// ErrLockLost: the lock was lost while held: renewal failed, the local
	// deadline passed, the key was deleted or changed behind the holder's
	// back, or the hold cap was reached.
	ErrLockLost = errors.New("dlock: lock lost")
	// ErrNotHeld: the server no longer holds the lock for this owner.
	ErrNotHeld = errors.New("dlock: lock not held")
	// ErrReleased: the lock was released by its holder.
	ErrReleased = errors.New("dlock: lock released")

	// ErrInvalidKey: the key is empty or longer than MaxKeyLen.
	ErrInvalidKey = errors.New("dlock: invalid key")
	// ErrInvalidTTL: the TTL is zero, negative, below the backend minimum
	// or above MaxTTL.
	ErrInvalidTTL = errors.New("dlock: invalid ttl")
	// ErrInvalidOption: an option has a value outside its documented range.
	ErrInvalidOption = errors.New("dlock: invalid option")
	// ErrNilClient: a backend was constructed without a client.
	ErrNilClient = errors.New("dlock: nil client")
	// ErrStaleToken: a guard refused an operation because a newer fencing
	// token (or the same token from another owner) has already been accepted.
	ErrStaleToken = errors.New("dlock: stale fencing token")
	// ErrHoldCapReached: the lock reached the total hold time set with
	// WithMaxHold. It is reported wrapped together with ErrLockLost.
	ErrHoldCapReached = errors.New("dlock: hold cap reached")
	// ErrUnsupported: the backend does not offer what was asked (a shared
	// or counted lock on a backend without them, listing). The message
	// names the mode or feature.
	ErrUnsupported = errors.New("dlock: not supported")
	// ErrLimitMismatch: a WithLimit(n) request on a key whose current
	// holders took it with another limit. The message names both. It also
	// matches ErrInvalidOption.
	ErrLimitMismatch = fmt.Errorf("%w: semaphore limit mismatch", ErrInvalidOption)
)

// Unavailable returns err marked as ErrUnavailable, for a backend whose
// request could not reach its service or lost the connection under it (a
// refused or reset connection; see driver.Unreachable). The result wraps
// both ErrUnavailable and err, so errors.Is(result, syscall.ECONNREFUSED)
// holds where it held for err; its message is ErrUnavailable's followed by
// err's, without a "dlock: " prefix of its own. A nil err, or one that
// already wraps ErrUnavailable, is returned as it is.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return &unavailableError{err: err}
}

// unavailableError is an error of Unavailable.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string {
	return ErrUnavailable.Error() + ": " + strings.TrimPrefix(e.err.Error(), "dlock: ")
}

// Unwrap returns ErrUnavailable and the error it marks.
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// NotAcquiredError says why a lock could not be had: the key is held. It
// unwraps to ErrNotAcquired and, when waiting ended because of the context,
// to the context's error as well.
type NotAcquiredError struct {
	Key string
	// Holders are the holders seen, when the backend knows them: one for an
	// exclusive lock, several for shared or counted ones. A reservation for
	// a woken waiter shows as a holder without an owner.
	Holders []Holder
	// Cause is an extra reason: the context's error or a quorum report.
	Cause error
}

func (e *NotAcquiredError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock: lock %q not acquired", e.Key)
	if len(e.Holders) > 0 {
		h := e.Holders[0]
		if h.Owner != "" || len(h.Metadata) > 0 {
			b.WriteString(": held by ")
			b.WriteString(h.String())
		} else {
			b.WriteString(": held")
		}
		if h.TTL > 0 {
			fmt.Fprintf(&b, " (ttl %s)", h.TTL.Round(time.Millisecond))
		}
		if n := len(e.Holders) - 1; n > 0 {
			fmt.Fprintf(&b, " and %d more", n)
		}
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap returns ErrNotAcquired and the cause, if any.
func (e *NotAcquiredError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrNotAcquired, e.Cause}
	}
	return []error{ErrNotAcquired}
}

// soonest is the shortest known time left on a holder's lease (0 if none
// is known): the key may be free by then.
func (e *NotAcquiredError) soonest() time.Duration {
	var d time.Duration
	for _, h := range e.Holders {
		if h.TTL > 0 && (d == 0 || h.TTL < d) {
			d = h.TTL
		}
	}
	return d
}

// LostError reports why a held lock was lost. It unwraps to ErrLockLost and
// to the underlying cause (ErrNotHeld, ErrHoldCapReached, a network error...).
type LostError struct {
	Key    string
	Token  uint64
	Reason LossReason
	Cause  error
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("dlock: lock %q (token %d) lost: %s", e.Key, e.Token, e.Reason.text())
	if e.Cause != nil && e.Cause != ErrHoldCapReached { // its text is the reason's
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns ErrLockLost and the cause, if any.
func (e *LostError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrLockLost, e.Cause}
	}
	return []error{ErrLockLost}
}

// StaleTokenError is returned by guards when a fence is refused.
type StaleTokenError struct {
	Resource string
	Token    uint64
	Owner    string
	// Highest is the token the fence had to reach
	// (FenceRecord.Bar): for an exclusive fence, the highest token the
	// resource accepted in any mode; for a shared one, the last
	// exclusive fence's token.
	Highest uint64
}

func (e *StaleTokenError) Error() string {
	if e.Token == 0 {
		return fmt.Sprintf("dlock: stale fencing token for %q: token 0 is no lock's token (highest accepted %d)", e.Resource, e.Highest)
	}
	if e.Token == e.Highest {
		return fmt.Sprintf("dlock: stale fencing token for %q: token %d already accepted from another owner", e.Resource, e.Token)
	}
	return fmt.Sprintf("dlock: stale fencing token for %q: token %d < highest accepted %d", e.Resource, e.Token, e.Highest)
}

// Unwrap returns ErrStaleToken.
func (e *StaleTokenError) Unwrap() error { return ErrStaleToken }

// ctxErr is the end of ctx as an error: its cause, joined with ctx.Err()
// when the cause does not wrap it (a cause given to WithTimeoutCause or
// WithCancelCause), so that errors.Is(err, context.DeadlineExceeded) or
// context.Canceled holds for every error the context's end made.
func ctxErr(ctx context.Context) error {
	cause := context.Cause(ctx)
	if err := ctx.Err(); err != nil && !errors.Is(cause, err) {
		return errors.Join(cause, err)
	}
	return cause
}
