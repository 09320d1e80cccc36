package redislock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// EvictionError is returned by a Locker's Acquire and TryAcquire and by a
// Guard's operations on a server that may evict keys under memory
// pressure: its maxmemory is set and its maxmemory-policy is not
// noeviction. Every other policy may evict a lock key (it is a key, and it
// carries a TTL), which hands the lock to the next caller at once while
// the holder runs on until its next renewal; and a Guard's fence record
// (no TTL, but a key like any other under allkeys-*) which lets an older
// fence write again. It unwraps to dlock.ErrUnsupported.
//
// Fix it on the server (CONFIG SET maxmemory-policy noeviction, or a
// dedicated Redis for locks with no maxmemory), or accept the risk with
// WithUnsafeEviction.
type EvictionError struct {
	// Addr is the server that may evict (on a Cluster, a master's
	// address; "" for the client's own server).
	Addr string
	// MaxMemory is its maxmemory in bytes and Policy its
	// maxmemory-policy.
	MaxMemory int64
	Policy    string
}

func (e *EvictionError) Error() string {
	at := ""
	if e.Addr != "" {
		at = " at " + e.Addr
	}
	return fmt.Sprintf("dlock: redis server%s may evict lock keys (maxmemory %d, maxmemory-policy %s): "+
		"an evicted key hands the lock to another caller while its holder runs on; "+
		"set maxmemory-policy noeviction (or maxmemory 0), or pass redislock.WithUnsafeEviction() to accept the risk",
		at, e.MaxMemory, e.Policy)
}

// Unwrap returns dlock.ErrUnsupported.
func (e *EvictionError) Unwrap() error { return dlock.ErrUnsupported }

// checkEviction refuses a server that may evict keys, unless allowed.
// The server is asked once per Node (a failure to reach it is returned
// and asked again next time); the check returns by ctx's deadline.
func checkEviction(ctx context.Context, n *redisproto.Node, allowed bool) error {
	if allowed {
		return nil
	}
	if ev, ok := n.KnownEviction(); ok {
		return evictionError(ev)
	}
	ev, err, abandoned := redisproto.Await(ctx, n.Eviction)
	if abandoned || err != nil && ctx.Err() != nil {
		// No answer in time: like every call's (the client may have
		// given up on its own with the context's error).
		return fmt.Errorf("%w: redis eviction check: no answer before the context ended: %w", dlock.ErrUnavailable, context.Cause(ctx))
	}
	if err != nil {
		err = fmt.Errorf("dlock: redis eviction check: %w", err)
		if driver.Unreachable(err) {
			return dlock.Unavailable(err)
		}
		return err
	}
	return evictionError(ev)
}

// evictionError is the *EvictionError of a server that may evict keys,
// else nil.
func evictionError(ev redisproto.Eviction) error {
	if ev.Evicts() {
		return &EvictionError{Addr: ev.Addr, MaxMemory: ev.MaxMemory, Policy: ev.Policy}
	}
	return nil
}
