package filelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// DefaultPollInterval is how often, by default, a waiter re-checks a held
// key on its own, on top of the release notifications (in-process wake-ups
// and, on Linux, inotify). It is what bounds the delay of a waiter when a
// notification cannot reach it. Each period is jittered by ±25%.
const DefaultPollInterval = 250 * time.Millisecond

// MinPollInterval is the shortest poll interval WithPollInterval accepts.
const MinPollInterval = time.Millisecond

// opTimeout bounds the flock wait of operations that take no context
// (Expire).
const opTimeout = 30 * time.Second

type options struct {
	poll    time.Duration
	inotify bool
}

// Option configures a Locker: filelock's own options below and the
// core's (dlock.WithObserver).
type Option = driver.Option

// WithPollInterval sets the fallback polling period of waiters (default
// DefaultPollInterval, jittered ±25%). Values below MinPollInterval make
// New fail.
func WithPollInterval(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.poll = d })
}

// WithInotify turns the Linux inotify watch on the directory on (the
// default) or off. With it off, a release in another process is noticed by
// polling only; releases through a Locker of this process still wake
// waiters at once. It has no effect on other systems, which always poll.
func WithInotify(on bool) Option {
	return driver.Setting(func(o *options) { o.inotify = on })
}

// Locker is a lock service kept in a directory. Lockers are safe for
// concurrent use; Lockers on the same directory, in one process or many,
// exclude each other.
type Locker struct {
	e    *dlock.Engine
	dir  string
	opts options
}

var (
	_ dlock.Locker   = (*Locker)(nil)
	_ dlock.Lister   = (*Locker)(nil)
	_ driver.Driver  = (*backend)(nil)
	_ driver.Watcher = (*backend)(nil)
	_ driver.Aborter = (*backend)(nil)
)

// New returns a Locker on dir, creating the directory (mode 0700) if it is
// missing. It fails with an error wrapping dlock.ErrInvalidOption when dir
// is empty, exists but is not a directory, or is not writable, or when an
// option is out of range.
func New(dir string, opts ...Option) (*Locker, error) {
	o := options{poll: DefaultPollInterval, inotify: true}
	driver.Apply(&o, opts)
	if o.poll < MinPollInterval {
		return nil, fmt.Errorf("%w: filelock: poll interval %v is below %v", dlock.ErrInvalidOption, o.poll, MinPollInterval)
	}
	canon, err := prepareDir(dir)
	if err != nil {
		return nil, err
	}
	l := &Locker{dir: canon, opts: o}
	l.e = dlock.NewEngine((*backend)(l), opts...)
	return l, nil
}

// Acquire implements dlock.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.e.TryAcquire(ctx, key, opts...)
}

// Dir returns the lock directory (absolute, symlinks resolved).
func (l *Locker) Dir() string { return l.dir }

// errNilContext is returned by the entry points that take a context (List
// and the Guard's methods) for a nil one, like dlock's Acquire does.
var errNilContext = fmt.Errorf("%w: filelock: nil context", dlock.ErrInvalidOption)

// List returns the unexpired leases whose key starts with prefix, sorted by
// key. It reads the records without taking their flocks: each record is
// replaced atomically, so every entry is a consistent snapshot. Records that
// cannot be decoded are skipped.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("filelock: list: %w", err)
	}
	out := []dlock.Info{}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !strings.HasSuffix(e.Name(), leaseSuffix) || !e.Type().IsRegular() {
			continue
		}
		var r record
		if ok, err := readJSON(filepath.Join(l.dir, e.Name()), &r); !ok || err != nil {
			continue
		}
		now := time.Now().UnixNano()
		if !r.heldAt(now) || !strings.HasPrefix(r.Key, prefix) || fileID(r.Key)+leaseSuffix != e.Name() {
			continue
		}
		out = append(out, dlock.Info{Key: r.Key, Holders: []dlock.Holder{r.holder(now)}, Waiters: -1})
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Expire deletes key's lease as if it had expired, behind its holder's
// back (the token counter is kept). The holder notices at its next renewal
// and loses the lock. Expiring a free key does nothing.
func (l *Locker) Expire(key string) error {
	if err := dlock.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	b := (*backend)(l)
	cleared := false
	err := b.update(ctx, key, func(r *record, _ int64) (bool, bool, error) {
		if r.Owner == "" {
			return false, false, nil
		}
		r.clear()
		cleared = true
		return true, false, nil
	})
	if err != nil {
		return fmt.Errorf("filelock: expire %q: %w", key, err)
	}
	if cleared {
		b.wake(key)
	}
	return nil
}

// backend implements the dlock SPI on a Locker's directory.
type backend Locker

func (b *backend) recordPath(id string) string { return filepath.Join(b.dir, id+leaseSuffix) }

// update runs fn on key's record under the record's flock and writes the
// record back (atomically) when fn says so. fn gets the wall-clock time,
// taken after the flock was acquired.
func (b *backend) update(ctx context.Context, key string, fn func(r *record, now int64) (write, syncDir bool, err error)) error {
	id := fileID(key)
	fl, err := lockFile(ctx, filepath.Join(b.dir, id+leaseFlockSuffix))
	if err != nil {
		return err
	}
	defer fl.Close()
	path := b.recordPath(id)
	r, err := readRecord(path, key)
	if err != nil {
		return err
	}
	write, syncDir, err := fn(&r, time.Now().UnixNano())
	if err != nil || !write {
		return err
	}
	data, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	return writeAtomic(path, data, syncDir)
}

func notAcquired(r *record, now int64) *dlock.NotAcquiredError {
	return &dlock.NotAcquiredError{Key: r.Key, Holders: []dlock.Holder{r.holder(now)}}
}

// holder is the record's lease as other clients see it.
func (r *record) holder(now int64) dlock.Holder {
	return dlock.Holder{Owner: r.Owner, Token: r.Token, TTL: r.left(now), Metadata: maps.Clone(r.Metadata)}
}

// Spec implements driver.Driver.
func (b *backend) Spec() driver.Spec { return driver.Spec{Name: "file"} }

// Try implements driver.Driver.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	// Fast path for waiters: a held lease seen in an (atomically replaced)
	// record is a valid answer without contending for the flock.
	if r, err := readRecord(b.recordPath(fileID(req.Key)), req.Key); err == nil {
		if now := time.Now().UnixNano(); r.heldAt(now) {
			return driver.Grant{}, notAcquired(&r, now)
		}
	}
	var token uint64
	err := b.update(ctx, req.Key, func(r *record, now int64) (bool, bool, error) {
		if r.heldAt(now) {
			return false, false, notAcquired(r, now)
		}
		if r.Counter == math.MaxUint64 {
			return false, false, fmt.Errorf("filelock: key %q: fencing tokens exhausted", req.Key)
		}
		token = r.Counter + 1
		*r = record{
			Key:      req.Key,
			Owner:    req.Owner,
			Token:    token,
			Expires:  now + int64(req.TTL),
			Metadata: req.Metadata,
			Counter:  token,
		}
		// The counter grew: make the rename durable so no token is ever
		// issued twice, even across a power loss.
		return true, true, nil
	})
	if err != nil {
		var na *dlock.NotAcquiredError
		if !errors.As(err, &na) && token != 0 {
			// The write may have landed (e.g. only the directory fsync
			// failed): take the lease back so it does not linger to its TTL.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlock.DefaultReleaseTimeout)
			_ = b.releaseOwner(cctx, req.Key, req.Owner)
			cancel()
		}
		return driver.Grant{}, err
	}
	return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner}, Token: token}, nil
}

// Abort implements driver.Aborter: it removes owner's lease if one was
// granted.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	if err := b.releaseOwner(ctx, req.Key, req.Owner); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		return err
	}
	return nil
}

// releaseOwner is compare-and-delete: it clears key's lease if owner holds
// it unexpired, keeping the counter, and wakes waiters.
func (b *backend) releaseOwner(ctx context.Context, key, owner string) error {
	err := b.update(ctx, key, func(r *record, now int64) (bool, bool, error) {
		if r.Owner != owner || !r.heldAt(now) {
			return false, false, notHeld(key)
		}
		r.clear()
		return true, false, nil
	})
	if err == nil {
		b.wake(key)
	}
	return err
}

func notHeld(key string) error {
	return fmt.Errorf("%w: filelock key %q", dlock.ErrNotHeld, key)
}

// lease is one granted acquisition.
type lease struct {
	b          *backend
	key, owner string
}

// Refresh implements driver.Lease: compare-and-expire under the flock.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return l.b.update(ctx, l.key, func(r *record, now int64) (bool, bool, error) {
		if r.Owner != l.owner || !r.heldAt(now) {
			return false, false, notHeld(l.key)
		}
		r.Expires = now + int64(ttl)
		return true, false, nil
	})
}

// Release implements driver.Lease.
func (l *lease) Release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return l.b.releaseOwner(ctx, l.key, l.owner)
}
