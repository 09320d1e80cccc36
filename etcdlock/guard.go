// The Guard: fenced values and fenced transactions on etcd (guard.Guard).

package etcdlock

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
)

// DefaultGuardPrefix is where a Guard keeps its keys unless
// WithGuardPrefix says otherwise: resource R's highest fence at
// "dlock%guard/R" and its values under it (see Guard). The '%' not
// followed by "25" or "2F" makes it a name EscapeKey never produces, so
// no dlock lock's queue directory can hold the guard's keys.
const DefaultGuardPrefix = "dlock%guard/"

// maxGuardConflicts bounds the retries of a fenced transaction that lost a
// race with another writer of the same fence.
const maxGuardConflicts = 16

type guardOptions struct {
	prefix string
}

// WithGuardPrefix makes a Guard keep its keys under p (default
// DefaultGuardPrefix; empty means the default). Guards exclude each other
// only when they use the same prefix. The Locker ignores it.
func WithGuardPrefix(p string) Option {
	return driver.Setting(func(o *guardOptions) { o.prefix = p })
}

// Guard is a guard.Guard on etcd: it fences writes (and reads) to data
// kept in etcd, applying the rule of package guard
// (dlock.FenceRecord.Admit) through guard.Checker.
//
// Per resource R it keeps, under its prefix P, the fence record at P+R
// (FenceKey) and the value Put under name at P+R+"\x00"+name (ValueKey).
// Every operation is one etcd transaction that compares the fence key's
// mod revision with the one read just before, decided by Checker.Check on
// what was read; an admitted fence that changes the record is written in
// the same transaction. A transaction that lost a race with another
// writer of the fence decides again (at most 16 times). A refusal runs
// nothing, returns a *dlock.StaleTokenError and reports a dlock.Event of
// Kind dlock.EventRejected to the Observer given with dlock.WithObserver.
//
// Every method returns by its context's deadline with an error wrapping
// dlock.ErrUnavailable and the context's error; a write abandoned there
// may still take effect, fenced. A guard prefix of your own must not be
// the queue directory of a lock (a prefix "jobs/" is the queue of a lock
// named "jobs", which the guard's keys would block); the default never
// is. docs/etcdlock.md (Guard) describes the key layout in full.
type Guard struct {
	client *clientv3.Client
	prefix string
	chk    guard.Checker
	err    error // the constructor's failure: every call returns it
}

var _ guard.Guard = (*Guard)(nil)

// NewGuard returns a Guard on client keeping its keys under
// DefaultGuardPrefix or WithGuardPrefix's prefix. It accepts
// dlock.WithObserver (refusals are reported with Backend "etcd"); the
// Locker's options are ignored. A nil client gives a Guard whose every
// call fails with an error wrapping dlock.ErrNilClient (after the
// argument checks of guard.Checker.Validate), as does the zero Guard.
func NewGuard(client *clientv3.Client, opts ...Option) *Guard {
	o := guardOptions{}
	driver.Apply(&o, opts)
	if o.prefix == "" {
		o.prefix = DefaultGuardPrefix
	}
	g := &Guard{client: client, prefix: o.prefix, chk: guard.NewChecker("etcd", opts)}
	if client == nil {
		g.err = fmt.Errorf("%w: etcdlock.NewGuard was given a nil etcd client", dlock.ErrNilClient)
	}
	return g
}

// FenceKey is the key holding resource's highest accepted fence.
func (g *Guard) FenceKey(resource string) string { return g.prefix + resource }

// ValueKey is the key holding the value Put under name in resource.
func (g *Guard) ValueKey(resource, name string) string {
	return g.FenceKey(resource) + "\x00" + name
}

// errZeroGuard is the error of every call of a Guard not made by
// NewGuard.
var errZeroGuard = fmt.Errorf("%w: zero etcdlock.Guard (use NewGuard)", dlock.ErrNilClient)

// check validates a call's arguments, then reports NewGuard's failure, or
// the zero Guard's (it has no client to call).
func (g *Guard) check(ctx context.Context, resource string, names ...string) error {
	if err := g.chk.Validate(ctx, resource, names...); err != nil {
		return err
	}
	if g.err == nil && g.client == nil {
		return errZeroGuard
	}
	return g.err
}

// errBadFence reports a fence key whose value is not a fence record.
var errBadFence = errors.New("not a fence (delete it to reset the resource's fences)")

// Txn runs ops in one etcd transaction fenced by f and returns its
// response: Responses[0] is the fence key's (a put when f became the
// highest fence, a read otherwise) and ops' results follow
// (Responses[1:]). A stale fence returns a *dlock.StaleTokenError and runs
// nothing. ops must not write the guard's own keys.
func (g *Guard) Txn(ctx context.Context, resource string, f dlock.Fence, ops ...clientv3.Op) (_ *clientv3.TxnResponse, err error) {
	if err := g.check(ctx, resource); err != nil {
		return nil, err
	}
	defer unanswered(ctx, resource, &err)
	return g.txn(ctx, resource, f, ops)
}

func (g *Guard) txn(ctx context.Context, resource string, f dlock.Fence, ops []clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := g.chk.ValidateFence(f); err != nil {
		return nil, err
	}
	fk := g.FenceKey(resource)
	for attempt := 0; attempt < maxGuardConflicts; attempt++ {
		rec, modRev, err := g.read(ctx, resource)
		if err != nil {
			return nil, err
		}
		next, err := g.chk.Check(resource, rec, f)
		if err != nil {
			return nil, err
		}
		fenceOp := clientv3.OpGet(fk)
		if next != rec {
			fenceOp = clientv3.OpPut(fk, guard.EncodeRecord(next))
		}
		resp, err := g.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(fk), "=", modRev)).
			Then(append([]clientv3.Op{fenceOp}, ops...)...).
			Commit()
		if err != nil {
			return nil, fmt.Errorf("dlock: etcd guard %q: %w", resource, err)
		}
		if resp.Succeeded {
			return resp, nil
		}
		// Another fenced writer got in between: read the fence again.
	}
	return nil, fmt.Errorf("dlock: etcd guard %q: fence kept changing (%d conflicts)", resource, maxGuardConflicts)
}

// read returns resource's fence record and its key's mod revision (zero
// for a resource without one).
func (g *Guard) read(ctx context.Context, resource string) (dlock.FenceRecord, int64, error) {
	fk := g.FenceKey(resource)
	resp, err := g.client.Get(ctx, fk)
	if err != nil {
		return dlock.FenceRecord{}, 0, fmt.Errorf("dlock: etcd guard %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return dlock.FenceRecord{}, 0, nil
	}
	kv := resp.Kvs[0]
	rec, err := guard.DecodeRecord(string(kv.Value))
	if err != nil || len(kv.Value) == 0 {
		return dlock.FenceRecord{}, 0, fmt.Errorf("dlock: etcd guard %q: key %q holds %q: %w", resource, fk, kv.Value, errBadFence)
	}
	return rec, kv.ModRevision, nil
}

// Put implements guard.Guard: it sets ValueKey(resource, name) to value in
// one fenced transaction.
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) (err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return err
	}
	defer unanswered(ctx, resource, &err)
	_, err = g.txn(ctx, resource, f, []clientv3.Op{clientv3.OpPut(g.ValueKey(resource, name), value)})
	return err
}

// Get implements guard.Guard: it reads ValueKey(resource, name) in one
// fenced transaction (a fenced read: once it succeeds with an exclusive
// fence, older fences can no longer write). ok is false when name was
// never Put.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return "", false, err
	}
	defer unanswered(ctx, resource, &err)
	resp, err := g.txn(ctx, resource, f, []clientv3.Op{clientv3.OpGet(g.ValueKey(resource, name))})
	if err != nil {
		return "", false, err
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return "", false, nil
	}
	return string(kvs[0].Value), true, nil
}

// Highest implements guard.Guard: one read of FenceKey(resource).
func (g *Guard) Highest(ctx context.Context, resource string) (_ dlock.Fence, err error) {
	if err := g.check(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	defer unanswered(ctx, resource, &err)
	rec, _, err := g.read(ctx, resource)
	return rec.Exclusive, err
}

// unanswered makes *err, the failure of a guard call whose context ended,
// wrap dlock.ErrUnavailable as every guard's does (the store did not
// answer in time; the operation may still take effect, fenced). A
// refusal, a bad input and an error that already wraps it are left alone.
func unanswered(ctx context.Context, resource string, err *error) {
	e := *err
	if e == nil || ctx.Err() == nil || errors.Is(e, dlock.ErrUnavailable) || errors.Is(e, dlock.ErrStaleToken) || errors.Is(e, dlock.ErrInvalidOption) {
		return
	}
	if !errors.Is(e, ctx.Err()) {
		e = fmt.Errorf("%w (%w)", e, context.Cause(ctx))
	}
	*err = fmt.Errorf("%w: etcd guard %q: no answer before the context ended (the operation may still take effect, fenced): %w", dlock.ErrUnavailable, resource, e)
}
