package redislock

import (
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Option configures a Locker or a Guard: redislock's own options
// (WithPrefix, WithReplicaAcks) and the core's (dlock.WithObserver), in
// one list.
type Option = driver.Option

// config holds redislock's own settings.
type config struct {
	prefix     string
	acks       int
	ackTimeout time.Duration
	// unsafeEviction: WithUnsafeEviction.
	unsafeEviction bool
}

// WithPrefix sets the key prefix (default DefaultPrefix; an empty prefix
// means the default). Lockers must use the same prefix to exclude each
// other, and Guards to share their fences.
func WithPrefix(p string) Option {
	return driver.Setting(func(c *config) { c.prefix = p })
}

// WithReplicaAcks makes each acquisition and each renewal count only once
// at least n replicas acknowledged it: the script is followed by WAIT n
// timeout on the connection that ran it (one pipeline, one round trip).
// A Locker rolls back an acquisition acknowledged by fewer (an owner-checked
// release) and fails the attempt with a *ReplicationError (wrapping
// dlock.ErrTransient, so a blocking Acquire tries again, or, when fewer
// than n replicas are connected to the primary, dlock.ErrUnavailable,
// which a blocking Acquire returns: no attempt could succeed); a renewal
// acknowledged by fewer is not counted (the lock keeps its previous local
// deadline, and Lost() fires at it unless a later renewal is
// acknowledged). A Guard's writes (Put, IncrBy, Eval) fail with a
// *ReplicationError once applied but acknowledged by fewer. Releases and
// reads wait for nobody. See "Replica acknowledgement" in the package
// documentation for what acknowledgement does and does not cover.
//
// n is 0 (off, the default) to MaxReplicaAcks; timeout at most
// MaxAckTimeout, and <= 0 means DefaultAckTimeout. The client must be a
// *redis.Client (standalone or Sentinel: redis.NewClient,
// redis.NewFailoverClient) whose ReadTimeout (default 3s) is above
// timeout, so that the WAIT's reply is read. Otherwise every call of the
// Locker or Guard fails with an error wrapping dlock.ErrInvalidOption.
// Each attempt and renewal takes up to timeout longer when replicas are
// slow or gone: keep timeout well below the locks' TTL.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return driver.Setting(func(c *config) { c.acks, c.ackTimeout = n, timeout })
}

// newConfig applies opts to the defaults.
func newConfig(opts []Option) config {
	c := config{prefix: DefaultPrefix}
	driver.Apply(&c, opts)
	if c.prefix == "" {
		c.prefix = DefaultPrefix
	}
	if c.ackTimeout <= 0 {
		c.ackTimeout = DefaultAckTimeout
	}
	return c
}
