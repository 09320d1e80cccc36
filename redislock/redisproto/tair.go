package redisproto

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Lua-free protocol for exclusive locks, on a server with Tair's CAS
// and CAD (Alibaba Cloud Tair, or redis-server with the TairString
// module) where scripts may be denied: native commands only, no script,
// no MULTI. The keys and values are the scripts' (see the package
// documentation), so both protocols read each other's leases.
//
//   - Acquire (two round trips): SET the lease with token 0 NX PX ttl,
//     then GET, PTTL and TIME in the same pipeline; a grant then writes
//     its token with CAS (the lease still token 0, so still this
//     attempt's) and PX. The token is max(server time in µs after the
//     grant, the released token a marker holds + 1): taken while the
//     attempt holds the key, after every earlier holder's grant, so it is
//     above theirs (while the server's clock does not go back, the same
//     assumption as next_token in lua/helpers.lua). A release marker
//     "|<token>" (left by a script release) is taken over by CAS.
//   - Refresh: CAS the value to itself with PX ttl.
//   - Release: CAD the value, and PUBLISH on the key's free channel in
//     the same round trip.
//
// CAS without an expiry removes the key's TTL: every CAS here gives one.

// freeSuffix is the channel a Lua-free release publishes on.
const freeSuffix = ":free"

// FreeChannel is the channel TairRelease publishes on when it released
// key: waiters of the Lua-free protocol listen on it.
func (n *Node) FreeChannel(key string) string { return n.LockKey(key) + freeSuffix }

// keyCmdable is a client that also sends arbitrary commands (CAS, CAD).
type keyCmdable interface {
	redis.Cmdable
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// keyClient is the client that reaches key's server with commands that
// name no key (TIME): a Cluster client's master for the key's slot, else
// the Node's client.
func (n *Node) keyClient(ctx context.Context, key string) (keyCmdable, error) {
	if cc, ok := n.Client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return n.Client, nil
}

// TairAcquire is the Lua-free exclusive acquisition (see above). A held
// key (or one reserved for a waiter a script release woke) is a refusal
// naming its holder, as Acquire's. ttl must be at least a millisecond.
func (n *Node) TairAcquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (Outcome, error) {
	if ttl < time.Millisecond {
		return Outcome{}, fmt.Errorf("TairAcquire: ttl %v below 1ms", ttl)
	}
	start := time.Now()
	lk := n.LockKey(key)
	c, err := n.keyClient(ctx, lk)
	if err != nil {
		return Outcome{}, err
	}
	hold := FormatValue(owner, 0, meta)
	var (
		get  *redis.StringCmd
		pttl *redis.DurationCmd
		now  *redis.TimeCmd
	)
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SetNX(ctx, lk, hold, ttl)
		get, pttl, now = p.Get(ctx, lk), p.PTTL(ctx, lk), p.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Outcome{}, err
	}
	v := get.Val()
	var last uint64
	switch {
	case strings.HasPrefix(v, owner+"|"):
		// This attempt's grant, now or by a resend of the pipeline.
		if info := ParseValue(v); info.Token != 0 {
			return Outcome{Granted: true, Token: info.Token}, nil
		}
	case strings.HasPrefix(v, "|") && !isReserved(v):
		// A script release's marker: free, and its token is the key's
		// latest.
		t, err := strconv.ParseUint(strings.TrimPrefix(v, "|"), 10, 64)
		if err != nil {
			return Outcome{}, fmt.Errorf("TairAcquire %q: bad marker %q", key, v)
		}
		last = t
		if err := c.Do(ctx, "CAS", lk, v, hold, "PX", Ms(ttl)).Err(); err != nil {
			return Outcome{}, err
		}
		if now, err = timeAfter(ctx, c, lk, hold); err != nil || now == nil {
			return n.tairRefusal(ctx, c, lk, err)
		}
	default:
		return refusalOf(v, pttl.Val())
	}
	tok := max(uint64(now.Val().UnixMicro()), last+1)
	if tok >= 1<<53 {
		return Outcome{}, fmt.Errorf("TairAcquire %q: token %d is 2^53 or more", key, tok)
	}
	left := ttl - time.Since(start)
	if left < time.Millisecond {
		_ = n.TairDelete(ctx, key, hold)
		return Outcome{}, fmt.Errorf("TairAcquire %q: the grant took %v of its %v TTL", key, time.Since(start), ttl)
	}
	stamped := FormatValue(owner, tok, meta)
	switch r, err := c.Do(ctx, "CAS", lk, hold, stamped, "PX", Ms(left)).Int64(); {
	case err != nil:
		return Outcome{}, err
	case r == 1:
		return Outcome{Granted: true, Token: tok}, nil
	}
	// The grant is gone (expired, broken) or already stamped by a resend
	// of this CAS: read which.
	cur, err := c.Get(ctx, lk).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return Outcome{}, err
	}
	if cur == stamped {
		return Outcome{Granted: true, Token: tok}, nil
	}
	return Outcome{}, fmt.Errorf("TairAcquire %q: the grant was gone before its token was written", key)
}

// timeAfter reads the server's time after checking, in the same round
// trip, that lk holds want: nil when it does not.
func timeAfter(ctx context.Context, c keyCmdable, lk, want string) (*redis.TimeCmd, error) {
	var (
		get *redis.StringCmd
		now *redis.TimeCmd
	)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, now = p.Get(ctx, lk), p.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	if get.Val() != want {
		return nil, nil
	}
	return now, nil
}

// tairRefusal reads lk's holder after a takeover that did not happen.
func (n *Node) tairRefusal(ctx context.Context, c keyCmdable, lk string, err error) (Outcome, error) {
	if err != nil {
		return Outcome{}, err
	}
	var (
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	)
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, pttl = p.Get(ctx, lk), p.PTTL(ctx, lk)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Outcome{}, err
	}
	return refusalOf(get.Val(), pttl.Val())
}

// refusalOf is the Outcome of a key held as v, with pttl left.
func refusalOf(v string, pttl time.Duration) (Outcome, error) {
	return parseOutcome([]any{int64(0), v, pttl.Milliseconds()}, nil)
}

// isReserved reports whether a release marker reserves the key for a
// waiter ("|<token>|<wait id>|<until ms>").
func isReserved(v string) bool {
	_, ok := reservedFor(v)
	return ok
}

// TairRefresh extends the lease value to ttl if the key still holds it:
// CAS value value PX ttl.
func (n *Node) TairRefresh(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	r, err := n.Client.Do(ctx, "CAS", n.LockKey(key), value, value, "PX", Ms(ttl)).Int64()
	return r == 1, err
}

// TairRelease deletes the lease value if the key still holds it (CAD) and
// publishes on the key's free channel, in one round trip. released is
// true when CAD deleted it, and when the key was gone already (a resend
// of a release whose reply was lost, or a lease that expired or was
// broken: a caller that has not passed its lease's deadline rules out
// expiry); false when another value holds the key.
func (n *Node) TairRelease(ctx context.Context, key, value string) (released bool, err error) {
	lk := n.LockKey(key)
	var cad *redis.Cmd
	_, err = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cad = p.Do(ctx, "CAD", lk, value)
		p.Publish(ctx, lk+freeSuffix, "1")
		return nil
	})
	if err != nil {
		return false, err
	}
	r, err := cad.Int64()
	return r == 1 || r == -1, err
}

// ScriptsDenied reports whether err is the server refusing this user a
// script command (an ACL NOPERM on EVAL, EVALSHA or SCRIPT).
func ScriptsDenied(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	s := re.Error()
	return strings.HasPrefix(s, "NOPERM") &&
		(strings.Contains(s, "'evalsha'") || strings.Contains(s, "'eval'") || strings.Contains(s, "'script"))
}

// TairDelete deletes the lease value if the key still holds it (CAD),
// without telling waiters: the undoing of an attempt.
func (n *Node) TairDelete(ctx context.Context, key, value string) error {
	return n.Client.Do(ctx, "CAD", n.LockKey(key), value).Err()
}
