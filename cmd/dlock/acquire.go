package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// heldLock is a lock taken by run or hold, with what it needs.
type heldLock struct {
	lk     *dlock.Lock
	b      *backend
	sigc   chan os.Signal // the signals caught: they cancel the wait, and after it are the caller's
	stderr io.Writer      // the caller's, scrubbed of the URL's secrets
}

// close stops catching the signals and closes the backend (the lock
// itself is the caller's to release).
func (h *heldLock) close() {
	signal.Stop(h.sigc)
	h.b.close()
}

// takeLock opens the lock service of f's URL and takes r's lock, catching
// sigs meanwhile (a signal ends the wait, exit 128+N). On failure it has
// said why on stderr and returns nil and the exit status.
func takeLock(f *lockFlags, r acquireRequest, sigs []os.Signal, stderr io.Writer) (*heldLock, int) {
	// Nothing dlock prints may carry a secret of the URL.
	raw := f.url
	if raw == "" {
		raw = defaultURL()
	}
	stderr = &scrubWriter{w: stderr, secrets: secretsOf(raw)}
	if r.progress {
		stderr = &progressWriter{w: stderr}
	}
	// A closed stderr (or stdout) must not kill dlock (SIGPIPE) while it
	// holds a lock.
	catch(make(chan os.Signal, 1), syscall.SIGPIPE)

	// Connecting is bounded by --connect-timeout alone: a --wait shorter
	// than that must still leave time for one attempt (see acquireForRun).
	b, err := openBackend(raw, openOptions{connectTimeout: f.connect, verbose: f.verbose, logs: stderr})
	if err != nil {
		return nil, reportOpen(stderr, r.cmd, err)
	}
	// Signals dlock was started with ignored (nohup, "&" in a script) stay
	// ignored (and so does CMD's, which inherits them).
	sigc := make(chan os.Signal, 4)
	catch(sigc, sigs...)
	lk, code := acquireForRun(b, r, sigc, stderr)
	if lk == nil {
		signal.Stop(sigc)
		b.close()
		return nil, code
	}
	return &heldLock{lk: lk, b: b, sigc: sigc, stderr: stderr}, 0
}

// acquireRequest is what acquireForRun asks for.
type acquireRequest struct {
	cmd      string // "run" or "hold", for messages ("" is run)
	key      string
	ttl      time.Duration
	wait     time.Duration // 0: forever (unless nonblock)
	nonblock bool          // -n or -w 0: one attempt
	conflict int           // exit status when the lock is held
	attempt  time.Duration // --connect-timeout: bound on a first attempt that --wait does not cover
	mode     dlock.Mode    // --shared, --limit N or exclusive
	limit    int           // N of --limit N
	maxHold  time.Duration // --max-hold: 0 for no cap
	// gone, if not nil, ends the wait once closed (dlock hold: the process
	// that started it exited), with goneWhy said on stderr and exit 0.
	gone     <-chan struct{}
	goneWhy  string
	verbose  bool // --verbose: say who holds the lock while waiting, and how long it took
	progress bool // with verbose: a progress line on a long wait (stderr is a terminal, a *progressWriter)

	// observer gets the acquisition's and its Lock's Events, for
	// --metrics-file and --metrics; nil for none.
	observer dlock.Observer
}

// name is what r's messages start with: "dlock run".
func (r acquireRequest) name() string {
	if r.cmd == "" {
		return "dlock run"
	}
	return "dlock " + r.cmd
}

// options returns the lock options of r's mode and hold cap.
func (r acquireRequest) options() []dlock.Option {
	var opts []dlock.Option
	switch r.mode {
	case dlock.Shared:
		opts = append(opts, dlock.WithShared())
	case dlock.Limited:
		opts = append(opts, dlock.WithLimit(r.limit))
	}
	if r.maxHold > 0 {
		opts = append(opts, dlock.WithMaxHold(r.maxHold))
	}
	return opts
}

// acquireForRun takes the lock; on failure it returns nil and the exit code.
//
// Every run gets at least one whole attempt: with -n (or -w 0) it is the
// only one, and with a --wait shorter than --connect-timeout the first
// attempt may take up to --connect-timeout, so that -w 1us still takes a
// free key. Waiting for a holder after that ends when --wait, counted from
// the first attempt, has elapsed.
//
// With --verbose the first attempt is a TryAcquire of its own too (bounded
// by --connect-timeout): when it finds the key held, its error names the
// holders, which is what "waiting for KEY, held by ..." reports, at the
// cost of one more request; then dlock waits as it would have anyway.
// Whatever that attempt gets besides a usage error (an outage, no answer
// in time), the wait goes on as without --verbose.
func acquireForRun(b *backend, r acquireRequest, sigc chan os.Signal, stderr io.Writer) (*dlock.Lock, int) {
	name := r.name()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sig os.Signal
	goneWhileWaiting := false
	stop, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig = <-sigc:
			cancel()
		case <-r.gone: // a nil channel never fires
			goneWhileWaiting = true
			cancel()
		case <-stop:
		}
	}()
	opts := append([]dlock.Option{dlock.WithTTL(r.ttl), dlock.WithMetadata("cmd", name), dlock.WithCallObserver(r.observer)}, r.options()...)
	var (
		lk         *dlock.Lock
		err        error
		attemptCtx context.Context // the bounded first attempt's, if any
		// attemptTimedOut: that attempt ran out of --connect-timeout
		attemptTimedOut bool
		firstErr        error // that attempt's, when a wait followed it
	)
	start := time.Now()
	shortWait := r.wait > 0 && r.wait < r.attempt
	if r.nonblock || shortWait || r.verbose {
		var cancelAttempt context.CancelFunc
		attemptCtx, cancelAttempt = context.WithTimeout(ctx, r.attempt)
		lk, err = b.locker.TryAcquire(attemptCtx, r.key, opts...)
		// Read before cancelAttempt, which sets Err to Canceled: only a
		// deadline that passed means the lock service did not answer.
		attemptTimedOut = errors.Is(attemptCtx.Err(), context.DeadlineExceeded)
		cancelAttempt()
		left := r.wait - time.Since(start)
		if !r.nonblock && err != nil && (r.wait == 0 || left > 0) && ctx.Err() == nil &&
			(heldBySomeone(err) || errors.Is(err, dlock.ErrTransient) ||
				!shortWait && acquireErrorStatus(err, exitConflict) != exitUsage) {
			attemptCtx = nil // the error to report is the wait's
			firstErr = err
			if r.verbose {
				fmt.Fprintf(stderr, "%s: %s\n", name, waitingText(r, err))
			}
			if r.wait > 0 {
				opts = append(opts, dlock.WithWait(left))
			}
			stopProgress := func() {}
			if pw, ok := stderr.(*progressWriter); ok && r.progress {
				stopProgress = showProgress(pw, name, r.key, progressHolder(err), start)
			}
			lk, err = b.locker.Acquire(ctx, r.key, opts...)
			stopProgress()
		}
	} else {
		if r.wait > 0 {
			opts = append(opts, dlock.WithWait(r.wait))
		}
		lk, err = b.locker.Acquire(ctx, r.key, opts...)
	}
	close(stop)
	<-exited
	if goneWhileWaiting {
		if lk != nil {
			releaseNow(name, lk, stderr)
		}
		fmt.Fprintf(stderr, "%s: %s while waiting for %q: gave up waiting\n", name, r.goneWhy, r.key)
		return nil, 0
	}
	if s, ok := sig.(syscall.Signal); ok {
		if lk != nil {
			releaseNow(name, lk, stderr)
		}
		fmt.Fprintf(stderr, "%s: interrupted by %v while waiting for %q\n", name, sig, r.key)
		return nil, 128 + int(s)
	}
	if err == nil {
		if r.verbose {
			fmt.Fprintf(stderr, "%s: acquired %q after %.1fs, token %d\n", name, r.key, time.Since(start).Seconds(), lk.Token())
		}
		return lk, 0
	}
	code := acquireErrorStatus(err, r.conflict)
	if code == exitBackend && firstErr != nil && !heldBySomeone(firstErr) && !strings.Contains(err.Error(), errText(firstErr)) {
		// The wait may end in an attempt cut short by its deadline, which
		// says nothing of why the ones before failed (an unmet ?acks=):
		// keep the first attempt's cause.
		err = fmt.Errorf("%w; the first attempt failed: %s", err, errText(firstErr))
	}
	var na *dlock.NotAcquiredError
	switch {
	case evicts(err):
		fmt.Fprintf(stderr, "%s: %s: %v (with dlock, add ?unsafe_eviction=true to the URL to accept the risk)\n", name, b.where, err)
	case errors.Is(err, dlock.ErrUnsupported), errors.Is(err, dlock.ErrLimitMismatch):
		// The backend's own words name the mode, or both limits.
		fmt.Fprintf(stderr, "%s: %s: %v\n", name, b.where, err)
	case code == exitUsage:
		fmt.Fprintf(stderr, "%s: %s\n", name, errText(err))
	case code == exitBackend && attemptCtx != nil && attemptTimedOut && ctx.Err() == nil:
		fmt.Fprintf(stderr, "%s: %s: no answer to the lock request within --connect-timeout %s: %s\n", name, b.where, r.attempt, oneLine(errText(err)))
	case code == exitBackend && errors.Is(err, dlock.ErrNotAcquired):
		fmt.Fprintf(stderr, "%s: %s: no holder of %q was seen; the lock service did not answer: %s\n", name, b.where, r.key, oneLine(errText(err)))
	case code == exitBackend:
		fmt.Fprintf(stderr, "%s: %s: %s\n", name, b.where, oneLine(errText(err)))
	case errors.As(err, &na):
		msg := name + ": " + heldText(r, na)
		if !r.nonblock {
			msg += fmt.Sprintf(" (gave up after waiting %s)", r.wait)
		}
		fmt.Fprintln(stderr, msg)
	default:
		fmt.Fprintf(stderr, "%s: lock %q is held: %v\n", name, r.key, err)
	}
	return nil, code
}

// evicts reports a Redis refused because it may evict lock keys.
func evicts(err error) bool {
	var re *redislock.EvictionError
	var rl *redlock.EvictionError
	return errors.As(err, &re) || errors.As(err, &rl)
}

// acquireErrorStatus maps an acquisition error to dlock's exit status: the
// conflict status only when the error wraps dlock.ErrNotAcquired and a
// holder was actually observed (its owner, metadata or lease); anything
// else, an outage or a wait that ended without any answer, is a backend
// error (3) whatever -w and -n say. A mode the backend does not offer and
// a --limit other than the current holders' are usage errors (2): asking
// again will not help.
func acquireErrorStatus(err error, conflict int) int {
	switch {
	case errors.Is(err, dlock.ErrInvalidTTL), errors.Is(err, dlock.ErrInvalidKey), errors.Is(err, dlock.ErrInvalidOption),
		errors.Is(err, dlock.ErrUnsupported):
		return exitUsage
	case !heldBySomeone(err):
		return exitBackend
	}
	return conflict
}

// releaseNow releases lk with its own bounded context.
func releaseNow(name string, lk *dlock.Lock, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
	defer cancel()
	if err := lk.Release(ctx); err != nil && !errors.Is(err, dlock.ErrLockLost) {
		fmt.Fprintf(stderr, "%s: release %q: %v\n", name, lk.Key(), err)
	}
}
