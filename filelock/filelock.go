package filelock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	held heldWatch // the keys its locks hold (lease.go)
}

var (
	_ dlock.Locker   = (*Locker)(nil)
	_ dlock.Lister   = (*Locker)(nil)
	_ driver.Driver  = (*backend)(nil)
	_ driver.Watcher = (*backend)(nil)
	_ driver.Aborter = (*backend)(nil)
	_ driver.Leaver  = (*backend)(nil)
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

// List returns the keys with unexpired leases whose key starts with prefix,
// sorted by key, each with its mode, its limit (for a semaphore) and every
// unexpired holder, oldest token first. Waiters is -1: filelock keeps no
// queue. It reads the records without taking their flocks: each record is
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
		if !strings.HasPrefix(r.Key, prefix) || fileID(r.Key)+leaseSuffix != e.Name() {
			continue
		}
		now := time.Now().UnixNano()
		s := r.state(now)
		if len(s.holders) == 0 {
			continue
		}
		info := dlock.Info{Key: r.Key, Mode: dlock.Mode(s.mode), Limit: s.limit, Holders: s.public(now), Waiters: -1}
		if s.foreign {
			info.Holders = s.refusal(r.Key, now, false).Holders
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return strings.Compare(a.Key, b.Key) })
	dlock.FillHeldFor(out, time.Now())
	return out, nil
}

// Expire deletes key's leases (every holder's, in any mode) as if they had
// expired, behind the holders' backs (the token counter and any waiting
// writers' registrations are kept). The holders lose the lock at once if they
// have held it for more than 100 ms and are in this process or, with
// inotify, in another (see the package doc); the others at their next
// renewal. Expiring a free key does nothing.
func (l *Locker) Expire(key string) error {
	if err := dlock.ValidateKey(key); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	b := (*backend)(l)
	cleared := false
	err := b.update(ctx, key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		if len(s.holders) == 0 {
			return false, false, nil
		}
		s.holders, s.foreign = nil, false
		r.store(&s)
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

func (b *backend) writersPath(id string) string { return filepath.Join(b.dir, id+writersSuffix) }

// update runs fn on key's record under the record's flock and writes the
// record back (atomically) when fn says so. fn gets the wall-clock time,
// taken after the flock was acquired; it may also rewrite the key's
// writers file, which the same flock guards.
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

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec { return driver.Spec{Name: "file", Shared: true, Limited: true} }

// Try implements driver.Driver. The decision is keyState.decide, made
// under the record's flock; a refusal that writes nothing is answered from
// an unlocked read first.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	// The attempt's start bounds a waiting writer's registration: it
	// lapses no later than one TTL after the attempt.
	start := time.Now().UnixNano()
	id := fileID(req.Key)
	wpath := b.writersPath(id)
	// Fast path for waiters: a held lease seen in an (atomically replaced)
	// record, and a registration seen fresh, are valid answers without
	// contending for the flock.
	if r, err := readRecord(b.recordPath(id), req.Key); err == nil {
		now := time.Now().UnixNano()
		s := r.state(now)
		if needsWriters(req) {
			s.withWriters(readWriters(wpath, req.Key), now)
		}
		if out, _, err := s.decide(req.Key, req, now, start); out == refuse {
			return driver.Grant{}, err
		}
	}
	var token uint64
	err := b.update(ctx, req.Key, func(r *record, now int64) (bool, bool, error) {
		s := r.state(now)
		if needsWriters(req) {
			s.withWriters(readWriters(wpath, req.Key), now)
		}
		out, have, err := s.decide(req.Key, req, now, start)
		switch out {
		case grantHave:
			token = have
			return false, false, nil
		case refuse:
			return false, false, err
		case register:
			w := writerRec{Waiter: req.Waiter, Expires: start + int64(req.TTL)}
			if i := s.findWriter(req.Waiter); i >= 0 {
				s.writers[i] = w
			} else {
				s.writers = append(s.writers, w)
			}
			// Registrations are advisory: one that cannot be written costs
			// this writer its preference, never its exclusive lock.
			_ = writeWriters(wpath, req.Key, s.writers)
			return false, false, err
		}
		next := r.maxToken()
		if next == math.MaxUint64 {
			return false, false, fmt.Errorf("filelock: key %q: fencing tokens exhausted", req.Key)
		}
		token = next + 1
		if len(s.holders) == 0 {
			s.mode, s.limit = req.Mode, 0
			if req.Mode == driver.Limited {
				s.limit = req.Limit
			}
		}
		s.holders = append(s.holders, holderRec{Owner: req.Owner, Token: token, Expires: now + int64(req.TTL), Metadata: req.Metadata})
		if needsWriters(req) && s.removeWriter(req.Waiter) {
			// Granted: no longer waiting. Should the record's write below
			// fail, the writer registers again at its next attempt; should
			// this one fail, the registration lapses within a TTL, keeping
			// out meanwhile only readers, who could not have the key while
			// the writer holds it anyway.
			_ = writeWriters(wpath, req.Key, s.writers)
		}
		r.store(&s)
		r.Counter = token
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

// Leave implements driver.Leaver: it removes waiter's registration as a
// waiting writer of key, if there is one, and wakes the process's waiters
// (readers kept out by it may now proceed; other processes' are woken by
// inotify or their poll).
func (b *backend) Leave(ctx context.Context, key, waiter string) error {
	if waiter == "" || dlock.ValidateKey(key) != nil {
		return nil // never registered
	}
	wpath := b.writersPath(fileID(key))
	if !slices.ContainsFunc(readWriters(wpath, key), func(w writerRec) bool { return w.Waiter == waiter }) {
		// Not registered: registrations are made under the flock by the
		// waiter's own attempts, and its Acquire has ended.
		return nil
	}
	removed := false
	err := b.update(ctx, key, func(_ *record, now int64) (bool, bool, error) {
		var s keyState
		s.withWriters(readWriters(wpath, key), now)
		if !s.removeWriter(waiter) {
			return false, false, nil
		}
		removed = true
		return false, false, writeWriters(wpath, key, s.writers)
	})
	if removed {
		b.wake(key)
	}
	return err
}
