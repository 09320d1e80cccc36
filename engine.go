package dlock

import (
	"context"
	"errors"
	"fmt"
	"path"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Engine is the Locker every backend is built on: argument checks, the
// wait loop (notification plus bounded polling), the Lock handle, the shared
// watchdog and the Observer calls, over a driver.Driver. A backend's New
// creates one with NewEngine and its *Locker forwards to it; most code never
// uses an Engine directly.
//
// Every driver call the Engine makes on behalf of a caller returns by the
// caller's context, whatever the driver's client does with it: a call still
// running at the deadline is abandoned (and undone in the background if it
// turns out to have taken effect).
type Engine struct {
	drv     driver.Driver
	spec    driver.Spec
	minTTL  time.Duration
	watcher driver.Watcher // nil if the driver has none
	ready   driver.ReadyWatcher
	queuer  driver.Queuer
	aborter driver.Aborter
	leaver  driver.Leaver
	lister  heldLister
	wd      *watchdog
	src     *source
	rtt     atomic.Int64 // moving average of answered attempts, ns
	err     error        // the constructor's failure: every call returns it
}

var _ Locker = (*Engine)(nil)

// NewEngine returns an Engine over d, configured by the core's options
// among opts (WithObserver; a backend passes its New's whole option list,
// and the options meant for the backend are ignored here). Leases are
// renewed in batches when d implements driver.BatchRenewer.
//
// The Engine fails every call, with the same error, when d is nil
// (ErrNilClient), made by driver.Failed (its error), or when opts hold an
// option of a package other than the backend's (driver.Spec.OptionPackage,
// by default the package of d's type) and the core's: another backend's,
// which d would silently ignore (ErrInvalidOption, naming the package).
func NewEngine(d driver.Driver, opts ...driver.Option) *Engine {
	if d == nil {
		return failedEngine(fmt.Errorf("%w: nil driver", ErrNilClient))
	}
	if failed, err := driver.FailureOf(d); failed {
		return failedEngine(err)
	}
	spec := d.Spec()
	own := spec.OptionPackage
	if own == "" {
		own = driverPackage(d)
	}
	if own != "" {
		if _, name := driver.ForeignTo(opts, own); name != "" {
			return failedEngine(fmt.Errorf("%w: the %s Locker does not apply a %s option", ErrInvalidOption, path.Base(own), name))
		}
	}
	e := &Engine{drv: d, spec: spec}
	e.src = &source{name: e.spec.Name, obs: observerOf(opts)}
	if e.minTTL = e.spec.MinTTL; e.minTTL <= 0 {
		e.minTTL = MinTTL
	}
	e.watcher, _ = d.(driver.Watcher)
	e.ready, _ = d.(driver.ReadyWatcher)
	e.queuer, _ = d.(driver.Queuer)
	e.aborter, _ = d.(driver.Aborter)
	e.leaver, _ = d.(driver.Leaver)
	e.lister, _ = d.(heldLister)
	br, _ := d.(driver.BatchRenewer)
	e.wd = newWatchdog(br, e.src)
	return e
}

// failedEngine returns an Engine whose every call fails with err
// (ErrNilClient when err is nil).
func failedEngine(err error) *Engine {
	if err == nil {
		err = ErrNilClient
	}
	return &Engine{err: err, src: &source{}}
}

// failure returns the error the Engine was constructed with (nil for a
// working one). A nil *Engine (a nil backend Locker's) and the zero Engine
// (not made by NewEngine) report an error wrapping ErrNilClient.
func (e *Engine) failure() error {
	switch {
	case e == nil:
		return fmt.Errorf("%w: nil Locker", ErrNilClient)
	case e.err == nil && e.drv == nil:
		return fmt.Errorf("%w: zero dlock.Engine (use NewEngine)", ErrNilClient)
	}
	return e.err
}

// check returns the error a call with ctx must fail with before doing
// anything: the constructor's failure or a nil context.
func (e *Engine) check(ctx context.Context) error {
	if err := e.failure(); err != nil {
		return err
	}
	if ctx == nil {
		return errNilContext
	}
	return nil
}

// renewing reports how many locks the watchdog is keeping alive (tests).
func (e *Engine) renewing() int {
	if e.wd == nil {
		return 0
	}
	return e.wd.held()
}

// Acquire implements Locker.
func (e *Engine) Acquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return e.observed(ctx, key, opts, true)
}

// TryAcquire implements Locker.
func (e *Engine) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return e.observed(ctx, key, opts, false)
}

// errNilContext is returned for a nil context.
var errNilContext = fmt.Errorf("%w: nil context", ErrInvalidOption)

// observed is acquire with its EventWait and EventAcquire, reported to the
// Locker's Observer and to the call's (WithCallObserver). Without either
// it costs nothing more than acquire.
func (e *Engine) observed(ctx context.Context, key string, opts []Option, wait bool) (*Lock, error) {
	if err := e.failure(); err != nil {
		return nil, err
	}
	var start time.Time
	if e.src.obs != nil {
		start = time.Now()
	}
	cfg, err := e.config(ctx, key, opts)
	var call Observer
	switch {
	case cfg != nil:
		call = cfg.callObs
	case err != nil:
		call = callObserverOf(opts)
	}
	if e.src.obs == nil && call == nil {
		if err != nil {
			return nil, err
		}
		return e.acquire(ctx, cfg, wait)
	}
	if start.IsZero() {
		start = time.Now()
	}
	e.src.emitCall(call, Event{Kind: EventWait, Key: key})
	var lk *Lock
	if err == nil {
		lk, err = e.acquire(ctx, cfg, wait)
	}
	ev := Event{Kind: EventAcquire, Key: key, Wait: time.Since(start), Err: err}
	if cfg != nil {
		ev.Mode, ev.Attempts = cfg.mode, cfg.attempts
	}
	switch {
	case err == nil:
		ev.Result, ev.Token, ev.Owner = ResultAcquired, lk.token, lk.owner
	case errors.Is(err, ErrNotAcquired) && !wait && (ctx == nil || ctx.Err() == nil):
		ev.Result = ResultContended
	case errors.Is(err, ErrNotAcquired), errors.Is(err, ErrUnavailable):
		ev.Result = ResultTimeout
	default:
		ev.Result = ResultError
	}
	e.src.emitCall(call, ev)
	if lk != nil {
		e.src.announce(call, lk)
	}
	return lk, err
}

// config resolves a call's options: the config, or the error that refuses
// the call before any attempt (with the config when it was built).
func (e *Engine) config(ctx context.Context, key string, opts []Option) (*config, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	cfg, err := newConfig(key, e.minTTL, opts...)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.mode == Shared && !e.spec.Shared, cfg.mode == Limited && !e.spec.Limited:
		return cfg, fmt.Errorf("%w: the %s backend does not offer %s locks (%q)", ErrUnsupported, e.spec.Name, cfg.mode, key)
	}
	return cfg, nil
}

// driverPackage is the import path of the package that defines d's type
// ("" for an unnamed type).
func driverPackage(d driver.Driver) string {
	t := reflect.TypeOf(d)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}
