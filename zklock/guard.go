// The fencing guard on ZooKeeper: a resource's highest accepted fence in a
// znode, its named values in the znode's children, and every fenced
// operation one multi-op transaction conditioned on the fence znode's
// version.

package zklock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
)

// DefaultGuardPrefix is the znode under which a Guard keeps its fence
// znodes, apart from the locks.
const DefaultGuardPrefix = "/dlock-guard"

// maxGuardConflicts bounds the retries of a fenced operation that lost a
// race for the fence znode to another one.
const maxGuardConflicts = 64

type guardOptions struct {
	prefix string
}

// WithGuardPrefix keeps a Guard's znodes under p (default
// DefaultGuardPrefix), an absolute ZooKeeper path.
func WithGuardPrefix(p string) Option {
	return driver.Setting(func(o *guardOptions) { o.prefix = p })
}

// Guard is a fencing guard (guard.Guard) whose store is ZooKeeper: a
// resource kept in ZooKeeper is protected the way a lock's holder expects,
// even against a holder that lost its lock and does not know it yet.
//
// Resource R's fence record (dlock.FenceRecord) is the data of the znode
// FencePath(R) (guard.EncodeRecord), and the value Put under name N is the
// data of its child EscapeKey(N). Put and Get are each one multi-op
// transaction that sets the fence znode only if its version is the one
// read (every fenced operation bumps it), so a fence admitted by the rule
// of package guard cannot be overtaken between the check and the write,
// on any server of the ensemble.
//
// Every method returns by its context's deadline, or after the request
// timeout (WithRequestTimeout) with no answer; a call whose context ended
// first returns an error wrapping dlock.ErrUnavailable and the context's
// error. A write abandoned there may still take effect, fenced.
type Guard struct {
	b   *backend
	chk guard.Checker
	err error
}

var _ guard.Guard = (*Guard)(nil)

// NewGuard returns a Guard on conn keeping its znodes under
// DefaultGuardPrefix or WithGuardPrefix's prefix. It accepts
// WithRequestTimeout, WithDigest (the ACL of the znodes it creates) and
// dlock.WithObserver (refusals are reported with Backend "zookeeper"). A
// nil conn gives a Guard whose every call fails with an error wrapping
// dlock.ErrNilClient (after guard.Checker.Validate's argument checks), as
// does the zero Guard; an invalid prefix or timeout, dlock.ErrInvalidOption.
func NewGuard(conn *zk.Conn, opts ...Option) *Guard {
	o := options{}
	driver.Apply(&o, opts)
	g := guardOptions{prefix: DefaultGuardPrefix}
	driver.Apply(&g, opts)
	b := &backend{conn: conn, prefix: g.prefix, timeout: o.requestTimeout, acl: zk.WorldACL(zk.PermAll)}
	if o.digest {
		b.acl = zk.DigestACL(zk.PermAll, o.user, o.password)
	}
	if b.timeout == 0 {
		b.timeout = DefaultRequestTimeout
	}
	gd := &Guard{b: b, chk: guard.NewChecker("zookeeper", opts)}
	switch {
	case conn == nil:
		gd.err = fmt.Errorf("%w: zklock.NewGuard was given a nil *zk.Conn", dlock.ErrNilClient)
	case o.requestTimeout < 0:
		gd.err = fmt.Errorf("%w: zklock guard: negative request timeout %v", dlock.ErrInvalidOption, o.requestTimeout)
	case !validPrefix(g.prefix) || g.prefix == "/":
		gd.err = fmt.Errorf("%w: zklock guard: prefix %q is not an absolute ZooKeeper path below the root", dlock.ErrInvalidOption, g.prefix)
	}
	return gd
}

// FencePath is the znode holding resource's highest accepted fence; its
// children hold the resource's named values. The zero Guard's is under
// DefaultGuardPrefix.
func (g *Guard) FencePath(resource string) string {
	if g == nil || g.b == nil {
		return DefaultGuardPrefix + "/" + EscapeKey(resource)
	}
	return g.b.keyPath(resource)
}

// MaxValueLen is the largest value Put stores: a znode's data, with the
// rest of the request, must fit ZooKeeper's default packet limit
// (jute.maxbuffer, 1 MiB); a larger request makes the server drop the
// connection, and every lock sharing it.
const MaxValueLen = 1<<20 - 32<<10

// maxGuardRequest bounds a Put's whole multi-op request, as counted by
// putRequestSize: under ZooKeeper's default packet limit (jute.maxbuffer,
// 1 MiB) with room for the framing putRequestSize leaves out.
const maxGuardRequest = 1<<20 - 4<<10

// putRequestSize is an upper bound of the bytes of a Put's multi-op
// request: the fence znode's op (path, record, ACL) and the value's (path,
// value, ACL), with each op's fixed fields.
func (g *Guard) putRequestSize(fencePath, valuePath, value string, f dlock.Fence) int {
	acl := 0
	for _, a := range g.b.acl {
		acl += len(a.Scheme) + len(a.ID) + 16
	}
	record := 2*20 + 2 + len(f.Owner) // "<token>/<seen>|<owner>"
	const op = 64                     // an op's header, version, flags and length prefixes
	return op + len(fencePath) + record + acl + op + len(valuePath) + len(value) + acl
}

var errZeroGuard = fmt.Errorf("%w: zero zklock.Guard (use NewGuard)", dlock.ErrNilClient)

func (g *Guard) check(ctx context.Context, resource string, names ...string) error {
	if g == nil {
		return errZeroGuard
	}
	if err := g.chk.Validate(ctx, resource, names...); err != nil {
		return err
	}
	if g.b == nil {
		return errZeroGuard
	}
	return g.err
}

var errBadFence = errors.New("not a fence (delete the znode to reset the resource's fences)")

// fenceState is a fence znode as read: its record and version (exists
// false: no fence yet).
type fenceState struct {
	rec     dlock.FenceRecord
	version int32
	exists  bool
}

// read returns resource's fence znode; after a sync when fresh is set (a
// read that must see every write acknowledged before it: Highest).
func (g *Guard) read(ctx context.Context, resource string, fresh bool) (fenceState, error) {
	b, path := g.b, g.FencePath(resource)
	if fresh {
		if _, err := call(ctx, b, "guard sync", func() (string, error) { return b.conn.Sync(path) }); err != nil {
			return fenceState{}, err
		}
	}
	type got struct {
		data []byte
		stat *zk.Stat
	}
	r, err := call(ctx, b, "guard read", func() (got, error) {
		d, st, err := b.conn.Get(path)
		return got{d, st}, err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return fenceState{}, nil
	}
	if err != nil {
		return fenceState{}, err
	}
	rec, err := guard.DecodeRecord(string(r.data))
	if err != nil {
		return fenceState{}, fmt.Errorf("dlock: zookeeper guard %q: znode %s holds %q: %w", resource, path, r.data, errBadFence)
	}
	return fenceState{rec: rec, version: r.stat.Version, exists: true}, nil
}

// ensureParent creates the guard's prefix znodes, as far as missing.
func (g *Guard) ensureParent(ctx context.Context) error {
	b, p := g.b, ""
	for _, seg := range strings.Split(strings.TrimPrefix(b.prefix, "/"), "/") {
		p += "/" + seg
		_, err := call(ctx, b, "guard create", func() (string, error) {
			return b.conn.Create(p, nil, zk.FlagPersistent, b.acl)
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// fenced runs one fenced transaction for resource: it reads the fence,
// applies the rule to f, and commits the fence znode (written, or created,
// with the next highest fence; conditioned on the version read) together
// with the ops from ops(), which may read the store first (given the
// fence state). It retries when another fenced operation got in between.
func (g *Guard) fenced(ctx context.Context, resource string, f dlock.Fence, ops func(fenceState) ([]any, error)) error {
	if err := g.chk.ValidateFence(f); err != nil {
		return err
	}
	b, path := g.b, g.FencePath(resource)
	for attempt := 0; attempt < maxGuardConflicts; attempt++ {
		st, err := g.read(ctx, resource, false)
		if err != nil {
			return err
		}
		next, err := g.chk.Check(resource, st.rec, f)
		if err != nil {
			return err
		}
		more, err := ops(st)
		if err != nil {
			return err
		}
		var fenceOp any = &zk.SetDataRequest{Path: path, Data: []byte(guard.EncodeRecord(next)), Version: st.version}
		if !st.exists {
			fenceOp = &zk.CreateRequest{Path: path, Data: []byte(guard.EncodeRecord(next)), Acl: b.acl, Flags: zk.FlagPersistent}
		}
		_, err = call(ctx, b, "guard commit", func() ([]zk.MultiResponse, error) {
			return multi(b.conn, append([]any{fenceOp}, more...)...)
		})
		if err == nil {
			return nil
		}
		switch {
		case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists):
			// Another fenced operation committed first: read again.
		case errors.Is(err, zk.ErrNoNode) && !st.exists:
			// Only the fence znode's create can miss its parent (a value
			// created with it is its child): the prefix is missing.
			if err := g.ensureParent(ctx); err != nil {
				return err
			}
		case errors.Is(err, zk.ErrNoNode):
			// The fence znode or a value was deleted meanwhile: read again.
		default:
			return fmt.Errorf("dlock: zookeeper guard %q: %w", resource, err)
		}
		if attempt > 8 {
			time.Sleep(time.Duration(attempt) * time.Millisecond)
		}
	}
	return fmt.Errorf("dlock: zookeeper guard %q: the fence kept changing (%d conflicts)", resource, maxGuardConflicts)
}

// multi runs ops as one transaction; a failed transaction returns the
// error of the op that failed.
func multi(c *zk.Conn, ops ...any) ([]zk.MultiResponse, error) {
	res, err := c.Multi(ops...)
	if err != nil {
		return res, err
	}
	for _, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return res, r.Error
		}
	}
	return res, nil
}

// Put implements guard.Guard: one transaction sets the fence znode and
// creates or sets the value's child.
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) (err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return err
	}
	defer unanswered(ctx, resource, &err)
	if len(value) > MaxValueLen {
		return fmt.Errorf("%w: zookeeper guard %q: a %d-byte value is over MaxValueLen (%d): ZooKeeper would drop the connection", dlock.ErrInvalidOption, resource, len(value), MaxValueLen)
	}
	b, vpath := g.b, g.FencePath(resource)+"/"+EscapeKey(name)
	if n := g.putRequestSize(g.FencePath(resource), vpath, value, f); n > maxGuardRequest {
		return fmt.Errorf("%w: zookeeper guard %q: the request (a %d-byte value, its paths, fence and ACLs) would take %d bytes, over the %d ZooKeeper accepts: ZooKeeper would drop the connection", dlock.ErrInvalidOption, resource, len(value), n, maxGuardRequest)
	}
	return g.fenced(ctx, resource, f, func(st fenceState) ([]any, error) {
		exists := false
		if st.exists {
			ok, err := call(ctx, b, "guard read", func() (bool, error) {
				ok, _, err := b.conn.Exists(vpath)
				return ok, err
			})
			if err != nil {
				return nil, err
			}
			exists = ok
		}
		if exists {
			return []any{&zk.SetDataRequest{Path: vpath, Data: []byte(value), Version: -1}}, nil
		}
		return []any{&zk.CreateRequest{Path: vpath, Data: []byte(value), Acl: b.acl, Flags: zk.FlagPersistent}}, nil
	})
}

// Get implements guard.Guard: a fenced read. It reads the value and
// commits the fence znode conditioned on the version read before the
// value, so the value is the one current when the fence was recorded (no
// fenced write came in between).
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return "", false, err
	}
	defer unanswered(ctx, resource, &err)
	b, vpath := g.b, g.FencePath(resource)+"/"+EscapeKey(name)
	err = g.fenced(ctx, resource, f, func(st fenceState) ([]any, error) {
		value, ok = "", false
		if !st.exists {
			return nil, nil
		}
		d, err := call(ctx, b, "guard read", func() ([]byte, error) {
			d, _, err := b.conn.Get(vpath)
			return d, err
		})
		switch {
		case errors.Is(err, zk.ErrNoNode):
		case err != nil:
			return nil, err
		default:
			value, ok = string(d), true
		}
		return nil, nil
	})
	if err != nil {
		return "", false, err
	}
	return value, ok, nil
}

// Highest implements guard.Guard: a sync, then one read of
// FencePath(resource).
func (g *Guard) Highest(ctx context.Context, resource string) (_ dlock.Fence, err error) {
	if err := g.check(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	defer unanswered(ctx, resource, &err)
	st, err := g.read(ctx, resource, true)
	return st.rec.Exclusive, err
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
	*err = fmt.Errorf("%w: zookeeper guard %q: no answer before the context ended (the operation may still take effect, fenced): %w", dlock.ErrUnavailable, resource, e)
}
