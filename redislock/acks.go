package redislock

import (
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Replica acknowledgement (WithReplicaAcks).
const (
	// DefaultAckTimeout is WithReplicaAcks's timeout when it is given
	// one <= 0.
	DefaultAckTimeout = 500 * time.Millisecond
	// MaxReplicaAcks is the largest replica count WithReplicaAcks takes.
	MaxReplicaAcks = 100
	// MaxAckTimeout is the longest timeout WithReplicaAcks takes.
	MaxAckTimeout = time.Minute
)

// ErrNotReplicated is wrapped by every *ReplicationError: a write that
// fewer replicas than WithReplicaAcks asked for acknowledged in time.
var ErrNotReplicated = errors.New("dlock: redis: write not acknowledged by enough replicas")

// ReplicationError reports a write (Op: "acquire", "refresh", or a
// Guard's "guard put", "guard incrby", "guard eval") on key Key (a
// Guard's resource) that the primary applied but that fewer than Want
// replicas acknowledged within Timeout (Got did). It wraps
// ErrNotReplicated, and, for an acquisition whose lease was rolled back
// (nothing left behind, worth retrying), dlock.ErrTransient.
type ReplicationError struct {
	Key, Op   string
	Want, Got int
	Timeout   time.Duration

	// RolledBack: an acquisition's lease was released again.
	RolledBack bool

	// Connected is the number of replicas connected to the primary, read
	// after a refused acquisition, when it is below Want (-1: not read).
	// No acquisition can succeed until more replicas connect. For an
	// attempt without a deadline the error then wraps
	// dlock.ErrUnavailable, not dlock.ErrTransient, so a blocking Acquire
	// reports it instead of trying again for ever; with a deadline it
	// wraps both, and the Acquire waits for replicas until the deadline,
	// then reports the outage.
	Connected int

	unbounded bool // the attempt had no deadline

	waitErr     error // WAIT's own failure (Got is then 0)
	rollbackErr error // why the rollback failed
}

func (e *ReplicationError) Error() string {
	var what string
	if e.waitErr != nil {
		what = fmt.Sprintf("replica acknowledgement unknown (WAIT %d %s failed: %v)", e.Want, e.Timeout, e.waitErr)
	} else {
		what = fmt.Sprintf("%d of %d replicas acknowledged within %s", e.Got, e.Want, e.Timeout)
	}
	var then string
	switch {
	case e.unmeetable() && e.RolledBack:
		then = fmt.Sprintf("; the lease was rolled back; only %d replicas are connected to the primary, so no acquisition can be acknowledged by %d until more connect", e.Connected, e.Want)
	case e.Op == "acquire" && e.RolledBack:
		then = "; the lease was rolled back"
	case e.Op == "acquire":
		then = fmt.Sprintf("; rolling the lease back failed (%v): it is removed in the background or expires with its TTL", e.rollbackErr)
	case e.Op == "refresh":
		then = "; the renewal is not counted (the lock keeps its previous deadline)"
	default:
		then = "; the write was applied on the primary but its outcome across a failover is unknown (the fence stays recorded on the primary)"
	}
	return fmt.Sprintf("dlock: redis %s %q: %s%s", e.Op, e.Key, what, then)
}

// Unwrap returns ErrNotReplicated; with it dlock.ErrUnavailable when
// fewer replicas than asked for are connected (Connected), else
// dlock.ErrTransient when the attempt left nothing behind (RolledBack).
func (e *ReplicationError) Unwrap() []error {
	switch {
	case e.unmeetable() && e.unbounded:
		return []error{ErrNotReplicated, dlock.ErrUnavailable}
	case e.unmeetable() && e.RolledBack:
		// Retried until the context ends (replicas may connect), and an
		// outage if they never do.
		return []error{ErrNotReplicated, dlock.ErrTransient, dlock.ErrUnavailable}
	case e.RolledBack:
		return []error{ErrNotReplicated, dlock.ErrTransient}
	}
	return []error{ErrNotReplicated}
}

// unmeetable: an acquisition refused because fewer replicas than asked
// for are connected.
func (e *ReplicationError) unmeetable() bool {
	return e.Op == "acquire" && e.Connected >= 0 && e.Connected < e.Want
}

// replicationError turns redisproto's *AckError for op on key into a
// *ReplicationError.
func replicationError(key, op string, ae *redisproto.AckError) *ReplicationError {
	return &ReplicationError{Key: key, Op: op, Want: ae.Want, Got: ae.Got, Timeout: ae.Timeout, Connected: -1, waitErr: ae.Err}
}
