package filelock

import (
	"context"
	"fmt"
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

type options struct {
	poll    time.Duration
	inotify bool
}

// Option configures a Locker: filelock's own options below and the
// core's (dlock.WithObserver).
type Option = dlock.LockerOption

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
	if _, name := driver.Foreign[options](opts); name != "" {
		return nil, fmt.Errorf("%w: a %s option given to filelock.New, which does not apply it", dlock.ErrInvalidOption, name)
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
	return l.engine().Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().TryAcquire(ctx, key, opts...)
}

// engine is l's Engine, nil for a nil *Locker: every call of a nil *Locker
// then fails with an error wrapping dlock.ErrNilClient instead of panicking.
func (l *Locker) engine() *dlock.Engine {
	if l == nil {
		return nil
	}
	return l.e
}

// Dir returns the lock directory (absolute, symlinks resolved); "" for a nil
// *Locker.
func (l *Locker) Dir() string {
	if l == nil {
		return ""
	}
	return l.dir
}

// backend implements the dlock SPI on a Locker's directory.
type backend Locker

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec { return driver.Spec{Name: "file", Shared: true, Limited: true} }
