package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Try implements driver.Driver: one acquire script (acquire.lua for an
// exclusive request, acquire_group.lua for a shared or limited one). A
// held key (or one reserved for a woken waiter) is a
// *dlock.NotAcquiredError naming the holders; a failed request is returned
// as is, and the Engine aborts it.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	meta, err := redisproto.EncodeMetadata(req.Metadata)
	if err != nil {
		return driver.Grant{}, err
	}
	if err := checkEviction(ctx, b.node, b.unsafeEviction); err != nil {
		return driver.Grant{}, err
	}
	switch tair, err := b.proto.mode(ctx); {
	case err != nil:
		return driver.Grant{}, requestError("acquire", req.Key, err)
	case tair:
		return b.tryTair(ctx, req, meta)
	}
	g, err := b.tryScripts(ctx, req, meta)
	if err == nil {
		return g, nil
	}
	if tair, ferr := b.proto.fallBack(ctx, err); !tair {
		if ferr != err {
			return driver.Grant{}, requestError("acquire", req.Key, ferr)
		}
		return g, err
	}
	return b.tryTair(ctx, req, meta)
}

// tryScripts is Try by the scripts.
func (b *backend) tryScripts(ctx context.Context, req *driver.Request, meta string) (driver.Grant, error) {
	defer b.waiters.Begin(req.WaitID)() // may queue the waiter
	gen := b.breaks.gen.Load()          // before the request: see breakWatch.gen
	group := req.Mode != driver.Exclusive
	var (
		o        redisproto.Outcome
		answered bool
		err      error
	)
	if !group && req.WaitID == "" && req.Attempt <= 1 && b.node.Acks == 0 {
		// The first attempt, not queued: the cheaper script for a free
		// key (and a held one, for a TryAcquire); any other state is
		// acquire.lua's to answer.
		o, answered, err = b.node.AcquireFast(ctx, req.Key, req.Owner, req.TTL, meta, req.Waiter == "")
		if err != nil {
			return driver.Grant{}, requestError("acquire", req.Key, err)
		}
		if answered && o.Granted {
			return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, token: o.Token, alone: true, gen: gen}, Token: o.Token}, nil
		}
	}
	switch {
	case answered:
	case group:
		limit := 0
		if req.Mode == driver.Limited {
			limit = req.Limit
		}
		o, err = b.node.AcquireGroup(ctx, req.Key, req.Owner, req.TTL, meta, req.WaitID, limit)
	default:
		o, err = b.node.Acquire(ctx, req.Key, req.Owner, req.TTL, meta, req.WaitID, req.Waiter)
	}
	var ae *redisproto.AckError
	if err != nil && o.Granted && errors.As(err, &ae) {
		return driver.Grant{}, b.rollback(ctx, req, o.Token, group, ae)
	}
	if err != nil {
		return driver.Grant{}, requestError("acquire", req.Key, err)
	}
	if o.Granted {
		b.waiters.Granted(req.WaitID) // the grant dequeued it
		return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, token: o.Token, group: group, gen: gen}, Token: o.Token}, nil
	}
	if o.LimitMismatch > 0 {
		return driver.Grant{}, fmt.Errorf("%w: redis key %q is held as a semaphore of %d permits, not %d",
			dlock.ErrLimitMismatch, req.Key, o.LimitMismatch, req.Limit)
	}
	return driver.Grant{}, notAcquired(req, o)
}

// notAcquired is the refusal o (not granted) of req.
func notAcquired(req *driver.Request, o redisproto.Outcome) *dlock.NotAcquiredError {
	na := &dlock.NotAcquiredError{Key: req.Key}
	switch {
	case o.Group != "":
		for _, h := range o.Holders {
			na.Holders = append(na.Holders, dlock.Holder{
				Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: groupMode(o.Group),
			})
		}
	default:
		na.Holders = []dlock.Holder{{
			Owner:    o.Holder.Owner,
			Token:    o.Holder.Token,
			Metadata: o.Holder.Metadata,
			TTL:      o.PTTL,
			Mode:     dlock.Exclusive,
		}}
	}
	switch {
	case o.WriterWaiting:
		na.Cause = errWriterWaiting
	case o.ReservedFor != "":
		na.Cause = reservedError(o.ReservedFor)
	}
	return na
}

// rollback releases a grant fewer replicas than asked acknowledged (ae),
// synchronously, on the attempt's ctx. Rolled back, the attempt left
// nothing behind: the *ReplicationError wraps dlock.ErrTransient, and a
// blocking Acquire tries again after a backoff step. Otherwise it does
// not, and the core undoes the attempt in the background (Abort). The
// error says how many replicas are connected when fewer than asked for
// are; then, for an attempt without a deadline, which could otherwise
// wait for ever without a word, it wraps dlock.ErrUnavailable instead of
// ErrTransient, and a blocking Acquire returns it.
func (b *backend) rollback(ctx context.Context, req *driver.Request, token uint64, group bool, ae *redisproto.AckError) error {
	re := replicationError(req.Key, "acquire", ae)
	l := &lease{b: b, key: req.Key, owner: req.Owner, token: token, group: group}
	if err := l.Release(ctx); err != nil {
		re.rollbackErr = err
	} else {
		re.RolledBack = true
	}
	if ae.Err == nil && ae.Got < ae.Want {
		if n, err := redisproto.ConnectedReplicas(ctx, b.node.Client); err == nil && n < ae.Want {
			re.Connected = n
			// A caller with a deadline waits for replicas to come back
			// (a restart, a resync) until it; one without would wait
			// for ever without a word.
			_, re.unbounded = ctx.Deadline()
			re.unbounded = !re.unbounded
		}
	}
	return re
}

// requestError is the error of a request (op) on key that failed: it
// wraps dlock.ErrUnavailable when the server could not be reached or
// dropped the connection (refused, reset), the client's error kept.
func requestError(op, key string, err error) error {
	what := op
	if key != "" {
		what += " " + strconv.Quote(key)
	}
	if redisproto.ScriptsDenied(err) {
		return fmt.Errorf("dlock: redis %s: %w (redislock runs Lua scripts: the client's ACL user needs EVALSHA and EVAL, e.g. +@scripting)", what, err)
	}
	err = fmt.Errorf("dlock: redis %s: %w", what, err)
	if driver.Unreachable(err) {
		return dlock.Unavailable(err)
	}
	return err
}

// errWriterWaiting explains a shared request refused for a waiting writer.
var errWriterWaiting = errors.New("an exclusive request is waiting for it (writer preference: new shared holders wait until it is granted, gives up or its registration expires)")

// reservedError explains a NotAcquiredError for a key that nobody holds
// but that a release reserved for the waiter it woke.
func reservedError(id string) error {
	return fmt.Errorf("nobody holds it: the last release reserved it for waiter %s, which it woke (a hand-over in progress)", id)
}

// groupMode is the dlock.Mode of a group's holders.
func groupMode(g string) dlock.Mode {
	if g == redisproto.GroupLimited {
		return dlock.Limited
	}
	return dlock.Shared
}

// Abort implements driver.Aborter: delete the lease if the lost reply had
// granted it.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	tair, none := b.proto.known()
	switch {
	case none:
		return nil // scripts refused and no Lua-free way: nothing ran
	case tair:
		return b.tairAbort(ctx, req)
	}
	err := (&lease{b: b, key: req.Key, owner: req.Owner, group: req.Mode != driver.Exclusive}).Release(ctx)
	if tair, _ := b.proto.fallBack(ctx, err); tair {
		return b.tairAbort(ctx, req)
	}
	return err
}

// tairAbort is Abort on the Lua-free protocol: only an exclusive request
// can have been granted there.
func (b *backend) tairAbort(ctx context.Context, req *driver.Request) error {
	if req.Mode != driver.Exclusive {
		return nil
	}
	if err := b.node.TairAbort(ctx, req.Key, req.Owner, FenceRetention); err != nil {
		return requestError("abort", req.Key, err)
	}
	return nil
}

// Leave implements driver.Leaver: withdraw a waiting writer's
// registration, so that readers kept out for it may enter at once.
func (b *backend) Leave(ctx context.Context, key, waiter string) error {
	if tair, none := b.proto.known(); waiter == "" || tair || none {
		return nil // no waiter was registered
	}
	return b.node.Leave(ctx, key, waiter)
}
