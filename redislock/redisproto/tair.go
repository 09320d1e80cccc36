package redisproto

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Lua-free protocol for exclusive locks, on a server with Tair's CAS
// and CAD (Alibaba Cloud Tair, or redis-server with the TairString
// module) where scripts may be denied: native commands only, no script,
// no MULTI. Its keys and values are the scripts' (see the package
// documentation), so a deployment may mix clients of both protocols.
//
//   - Acquire, two round trips. The first pipeline sends SET the lease
//     with token 0 NX PX ttl, then GET, PTTL and TIME. A key holding a
//     release marker ("|<token>", or a reservation for a waiter whose
//     time has run out) is taken over instead: CAS from the marker, its
//     token pushed to the receipts as take_marker does, then GET and
//     TIME. The second round trip writes the token with CAS and PX. The
//     token is max(the server's time in µs, read after the grant, the
//     marker's token + 1): it is taken while the attempt holds the key,
//     after every earlier holder's grant, and above the token the key
//     kept when its last lease was released.
//   - Refresh: CAS the value to itself, PX ttl.
//   - Release: CAS the value to the marker "|<token>", PX retention, as a
//     script release leaves it, and PUBLISH on the key's free channel.
//     The marker keeps the key's last token, so that the next token does
//     not rest on the server's clock alone, and proves the release to a
//     resend of it. CAD deletes only what a grant abandoned before its
//     token was written.
//
// Every CAS gives an expiry: CAS without one removes the key's TTL. A
// Ring client is refused: its pipelines send TIME and PUBLISH to other
// shards than the key's.

// freeSuffix is the channel a Lua-free release publishes on.
const freeSuffix = ":free"

// FreeChannel is the channel TairRelease publishes on: waiters of the
// Lua-free protocol listen on it.
func (n *Node) FreeChannel(key string) string { return n.LockKey(key) + freeSuffix }

// errTairRing refuses the Lua-free protocol on a Ring client.
var errTairRing = errors.New("the Lua-free protocol needs a standalone, Sentinel or Cluster client: a Ring sends TIME and PUBLISH to other shards than the key's")

// keyCmdable is a client that also sends arbitrary commands (CAS, CAD).
type keyCmdable interface {
	redis.Cmdable
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// keyClient is the client that reaches lk's server with the commands
// that name no key (TIME): a Cluster client's master for the key's slot,
// else the Node's client.
func (n *Node) keyClient(ctx context.Context, lk string) (keyCmdable, error) {
	switch c := n.Client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, lk)
	case *redis.Ring:
		return nil, errTairRing
	}
	return n.Client, nil
}

// maxTairToken bounds the tokens the Lua-free protocol hands out and the
// markers it takes over: a token must stay exact as a double (the
// scripts' numbers, and a guard's JSON), below 2^53.
const maxTairToken = 1<<53 - 3

// afterTakeOver, when set (tests), runs when TairAcquire has taken a
// release marker over, before it writes its token.
var afterTakeOver atomic.Pointer[func()]

// MarkerRetention is how long a release marker keeps its key's last token
// (redislock.FenceRetention).
const MarkerRetention = time.Hour

// TairAcquire is the Lua-free exclusive acquisition (see above). A held
// key, or one reserved for a waiter a script release woke, is a refusal
// naming its holder, as Acquire's. Each owner is used for one call: a
// call that failed may leave the owner's hold, which TairAbort undoes (an
// Engine aborts such an attempt). A resend of its requests by the client
// finds its own lease and goes on.
func (n *Node) TairAcquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (Outcome, error) {
	if ttl < time.Millisecond {
		return Outcome{}, fmt.Errorf("TairAcquire %q: ttl %v below 1ms", key, ttl)
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
			return Outcome{Granted: true, Token: info.Token, PTTL: pttl.Val()}, nil
		}
	case strings.HasPrefix(v, "|"):
		m, err := parseMarker(v)
		if err != nil {
			return Outcome{}, fmt.Errorf("TairAcquire %q: %w", key, err)
		}
		if left := m.until - now.Val().UnixMilli(); m.waiter != "" && left > 0 {
			return Outcome{ReservedFor: m.waiter, PTTL: time.Duration(left) * time.Millisecond,
				Holder: Info{Metadata: map[string]string{MetaReservedForWaiter: m.waiter}}}, nil
		}
		if m.token >= maxTairToken {
			return Outcome{}, fmt.Errorf("TairAcquire %q: DLOCKTOKEN the key's last token is %d: a next token above it cannot be kept exactly (2^53)", key, m.token)
		}
		// The hold carries the marker's token while it holds the key, so
		// that undoing it (TairAbort, or a grant too slow to stamp)
		// leaves the marker again rather than an empty key.
		last = m.token
		hold = FormatValue(owner, last, meta)
		if now, err = n.takeOver(ctx, c, lk, v, hold, last, ttl); err != nil {
			return Outcome{}, err
		}
		if now == nil {
			return n.tairRefusal(ctx, c, lk)
		}
		if h := afterTakeOver.Load(); h != nil {
			(*h)()
		}
	default:
		return refusalOf(v, pttl.Val())
	}
	tok := max(uint64(now.Val().UnixMicro()), last+1)
	left := ttl - time.Since(start)
	if left < time.Millisecond {
		_ = n.TairAbort(ctx, key, owner, MarkerRetention)
		return Outcome{}, fmt.Errorf("TairAcquire %q: the grant took %v of its %v TTL", key, time.Since(start), ttl)
	}
	stamped := FormatValue(owner, tok, meta)
	r, err := c.Do(ctx, "CAS", lk, hold, stamped, "PX", msUp(left)).Int64()
	if err != nil {
		return Outcome{}, err
	}
	if r != 1 {
		// 0: gone, or a resend of this CAS (the client's, after a lost
		// reply) that found it done.
		if v, err := c.Get(ctx, lk).Result(); err != nil && !errors.Is(err, redis.Nil) {
			return Outcome{}, err
		} else if v != stamped {
			return Outcome{}, fmt.Errorf("TairAcquire %q: the grant was gone (expired or broken) before its token was written", key)
		}
	}
	return Outcome{Granted: true, Token: tok, PTTL: left}, nil
}

// msUp is d in whole milliseconds, rounded up: a lease's expiry on the
// server is never before the one its holder counts with.
func msUp(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// marker is a release marker "|<token>" or "|<token>|<wait id>|<until ms>".
type marker struct {
	token  uint64
	waiter string
	until  int64 // ms on the server's clock; 0 without a waiter
}

func parseMarker(v string) (marker, error) {
	parts := strings.Split(strings.TrimPrefix(v, "|"), "|")
	var m marker
	var err error
	switch len(parts) {
	case 3:
		m.waiter = parts[1]
		if m.until, err = strconv.ParseInt(parts[2], 10, 64); err != nil {
			return m, fmt.Errorf("bad release marker %q", v)
		}
		fallthrough
	case 1:
		if m.token, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
			return m, fmt.Errorf("bad release marker %q", v)
		}
		return m, nil
	}
	return m, fmt.Errorf("bad release marker %q", v)
}

// takeOver replaces the release marker v with hold by CAS, records the
// marker's token last in the receipts (as take_marker in
// lua/helpers.lua does: the marker proves that lease's release), and
// returns the server's time after the takeover, or nil when lk does not
// hold hold (another client took the marker first).
func (n *Node) takeOver(ctx context.Context, c keyCmdable, lk, v, hold string, last uint64, ttl time.Duration) (*redis.TimeCmd, error) {
	var (
		get *redis.StringCmd
		now *redis.TimeCmd
	)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "CAS", lk, v, hold, "PX", Ms(ttl))
		if last != 0 {
			// Every contender that read the marker sends this: each
			// removes the copies of the token before it pushes its own,
			// so a herd leaves one receipt, not eight.
			rel := lk + receiptsSuffix
			p.LRem(ctx, rel, 0, last)
			p.LPush(ctx, rel, last)
			p.LTrim(ctx, rel, 0, Receipts-1)
			p.PExpire(ctx, rel, ReceiptRetention)
		}
		get, now = p.Get(ctx, lk), p.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	if get.Val() != hold {
		return nil, nil
	}
	return now, nil
}

// tairRefusal reads lk's holder after a takeover that did not happen.
func (n *Node) tairRefusal(ctx context.Context, c keyCmdable, lk string) (Outcome, error) {
	var (
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, pttl = p.Get(ctx, lk), p.PTTL(ctx, lk)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Outcome{}, err
	}
	return refusalOf(get.Val(), pttl.Val())
}

// refusalOf is the Outcome of a key held as v, with pttl left (PTTL's
// -1, no expiry, and -2, no key, count as 0).
func refusalOf(v string, pttl time.Duration) (Outcome, error) {
	return parseOutcome([]any{int64(0), v, max(pttl, 0).Milliseconds()}, nil)
}

// TairRefresh extends the lease value to ttl if the key still holds it:
// CAS value value PX ttl. ttl must be at least a millisecond.
func (n *Node) TairRefresh(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	if ttl < time.Millisecond {
		return false, fmt.Errorf("TairRefresh %q: ttl %v below 1ms", key, ttl)
	}
	r, err := n.Client.Do(ctx, "CAS", n.LockKey(key), value, value, "PX", msUp(ttl)).Int64()
	return r == 1, err
}

// TairRelease releases the lease value: CAS it to the release marker
// "|<token>" for retention, as a script release leaves it, and PUBLISH on
// the key's free channel, in one round trip. released is true when the
// CAS replaced the lease, and when the lease was released already (a
// resend of a release whose reply was lost: the key holds its marker, or
// a later grant took the marker over and recorded its token in the
// receipts; one more round trip reads them); false when the key no
// longer holds the lease (expired, broken, or another holder's), as the
// scripts' release answers. A PUBLISH the server refuses (an ACL without
// the channel) does not fail a release that happened: waiters then find
// the key free at their next poll.
//
// Not CAD: a release must leave the marker exactly when it removed the
// lease. After a CAD, nothing in the same round trip can know whether it
// removed anything: a marker written regardless would stand on a key
// whose lease had ended (and a resend would take it for its own), and a
// CAD whose reply was lost would leave no trace at all.
func (n *Node) TairRelease(ctx context.Context, key, value string, retention time.Duration) (released bool, err error) {
	if retention < time.Millisecond {
		return false, fmt.Errorf("TairRelease %q: retention %v below 1ms", key, retention)
	}
	lk := n.LockKey(key)
	tok := strconv.FormatUint(ParseValue(value).Token, 10)
	mark := "|" + tok
	var cas *redis.Cmd
	// The pipeline's own error is its first command's that failed;
	// PUBLISH's is left alone.
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cas = p.Do(ctx, "CAS", lk, value, mark, "PX", Ms(retention))
		p.Publish(ctx, lk+freeSuffix, "1")
		return nil
	})
	r, err := cas.Int64()
	switch {
	case err != nil:
		return false, err
	case r == 1:
		return true, nil
	}
	// The lease was not there: released before (a resend), or ended.
	var (
		get  *redis.StringCmd
		rels *redis.StringSliceCmd
	)
	if _, err := n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, rels = p.Get(ctx, lk), p.LRange(ctx, lk+receiptsSuffix, 0, Receipts-1)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	if v := get.Val(); v == mark || strings.HasPrefix(v, mark+"|") {
		return true, nil
	}
	for _, r := range rels.Val() {
		if r == tok && tok != "0" {
			return true, nil
		}
	}
	return false, nil
}

// TairDelete deletes the lease value if the key still holds it (CAD),
// without telling waiters: the undoing of an attempt.
func (n *Node) TairDelete(ctx context.Context, key, value string) error {
	return n.Client.Do(ctx, "CAD", n.LockKey(key), value).Err()
}

// TairAbort deletes owner's lease of key, if the key holds one, whatever
// its token (GET, then CAD of the value read): the undoing of an attempt
// whose reply was lost. A lease or hold with a token (a taken-over
// marker's) leaves the release marker, as TairRelease does.
func (n *Node) TairAbort(ctx context.Context, key, owner string, retention time.Duration) error {
	// The attempt's own requests may still be on their way (its token
	// write changes the value between the read and the delete): read
	// again while the key still names the owner, a few times.
	for range 3 {
		v, err := n.Client.Get(ctx, n.LockKey(key)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return nil
		case err != nil:
			return err
		case !strings.HasPrefix(v, owner+"|"):
			return nil
		}
		if ParseValue(v).Token == 0 {
			err = n.TairDelete(ctx, key, v)
		} else {
			_, err = n.TairRelease(ctx, key, v, retention)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TairBreak is Break in the Lua-free protocol, for exclusive leases: it
// reads the key and, when it holds a lease (owner's, or anyone's when
// owner is ""), replaces that value by CAS with the release marker
// "|<token+2>" (see lua/break.lua: the broken holder's resent release
// must not find a marker or receipt of its own; a hold without a token
// is deleted with CAD), then publishes on the break channel and the free
// channel. A lease granted after the read is
// never touched. A group (a shared or limited holder's key, written by
// the scripts) is an error: breaking it needs them.
func (n *Node) TairBreak(ctx context.Context, key, owner string, retention time.Duration) (removed, others []Info, err error) {
	lk := n.LockKey(key)
	var (
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	)
	if _, err := n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, pttl = p.Get(ctx, lk), p.PTTL(ctx, lk)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, err
	}
	v := get.Val()
	if v == "" || strings.HasPrefix(v, "|") {
		return nil, nil, nil
	}
	if _, _, _, ok := ParseGroup(v); ok {
		return nil, nil, fmt.Errorf("redis key %s holds shared or limited holders, which only the scripts can break", lk)
	}
	in := ParseValue(v)
	in.Key, in.TTL = key, max(pttl.Val(), 0)
	if in.Token > maxTairToken {
		return nil, nil, fmt.Errorf("redis key %s: DLOCKTOKEN its lease's token %d leaves no room for a marker above it below 2^53", lk, in.Token)
	}
	if owner != "" && in.Owner != owner {
		return nil, []Info{in}, nil
	}
	var del *redis.Cmd
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		if in.Token != 0 {
			del = p.Do(ctx, "CAS", lk, v, "|"+strconv.FormatUint(in.Token+2, 10), "PX", Ms(retention))
		} else {
			del = p.Do(ctx, "CAD", lk, v)
		}
		p.Publish(ctx, lk+breakChanSuffix, "1")
		p.Publish(ctx, lk+freeSuffix, "1")
		return nil
	})
	r, err := del.Int64()
	switch {
	case err != nil:
		return nil, nil, err
	case r != 1:
		// Released, expired or broken since the read: nothing removed.
		return nil, nil, nil
	}
	return []Info{in}, nil, nil
}

// compareCommands is a set of commands that compare a key's value before
// they write it or delete it, which the Lua-free protocol runs on.
type compareCommands struct {
	name     string
	commands []string // what COMMAND INFO must find
}

// compareTable lists the sets the Lua-free protocol can run on. Redis 8's
// SET ... IFEQ with DELEX ... IFEQ, and Valkey's SET ... IFEQ with
// DELIFEQ, would be entries here, each with its own calls in TairRefresh,
// TairRelease, TairDelete and TairAbort; none is listed while no test
// server has them.
var compareTable = []compareCommands{{name: "tair", commands: []string{"cas", "cad"}}}

// TairOffers reports whether the server has the Lua-free protocol's
// commands, Tair's CAS and CAD (COMMAND INFO, or, for a user that may not
// run COMMAND, CAS and CAD on a key that never exists; a Cluster client
// asks a random node: every node of a Cluster loads the same modules).
func (n *Node) TairOffers(ctx context.Context) (bool, error) {
	for _, set := range compareTable {
		args := append([]any{"COMMAND", "INFO"}, anys(set.commands)...)
		infos, err := n.Client.Do(ctx, args...).Slice()
		switch {
		case isNoPerm(err), isUnknownCommand(err):
			// COMMAND refused by an ACL, or renamed away: try the
			// commands themselves.
			ok, err := n.tairRuns(ctx)
			if ok || err != nil {
				return ok, err
			}
			continue
		case err != nil:
			// BUSY, LOADING, a lost link: no answer yet.
			return false, err
		}
		if len(infos) == len(set.commands) && !slices.Contains(infos, nil) {
			return true, nil
		}
	}
	return false, nil
}

// tairRuns runs CAS and CAD on a key that never exists (they write
// nothing there): they run when their replies are integers, and not
// when the server does not know them or the user may not run them; any
// other error (OOM, BUSY, a lost link) is no answer.
func (n *Node) tairRuns(ctx context.Context) (bool, error) {
	probe := n.Prefix + ":{}:cas-probe"
	var cas, cad *redis.Cmd
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cas = p.Do(ctx, "CAS", probe, "-", "-", "PX", 1)
		cad = p.Do(ctx, "CAD", probe, "-")
		return nil
	})
	for _, c := range []*redis.Cmd{cas, cad} {
		_, err := c.Int64()
		switch {
		case isNoPerm(err), isUnknownCommand(err):
			return false, nil
		case err != nil:
			return false, err
		}
	}
	return true, nil
}

// isUnknownCommand reports whether err is the server's reply to a
// command it does not have.
func isUnknownCommand(err error) bool {
	return isErrorReply(err) && strings.Contains(err.Error(), "unknown command")
}

// isNoPerm reports whether err is an ACL's refusal of a command.
func isNoPerm(err error) bool {
	return isErrorReply(err) && strings.HasPrefix(err.Error(), "NOPERM")
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// WatchFree is Watch for a waiter of the Lua-free protocol: it listens
// on the key's free channel, on which every Lua-free release publishes
// (every waiter of the key is told; none is reserved the key).
func (n *Node) WatchFree(ctx context.Context, key string) (*Subscription, error) {
	return n.hub.watch(ctx, n.FreeChannel(key), make(chan struct{}, 1))
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
