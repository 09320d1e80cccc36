package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// lockFlags are the options of run and hold that say which lock to take,
// where, and how long to wait for it.
type lockFlags struct {
	url      string
	urlSrc   *urlSource
	ttl      time.Duration
	wait     time.Duration
	waitSet  bool // -w given: -w 0 is one attempt, no -w is for ever
	nonblock bool
	conflict int
	shared   bool
	limit    int
	connect  time.Duration
	verbose  bool
	maxHold  time.Duration // --max-hold: 0 for no cap
}

// define adds the lock options to o, with their defaults (but those of
// defineLast).
func (f *lockFlags) define(o *optionSet) {
	f.ttl, f.conflict, f.connect = 30*time.Second, exitConflict, defaultConnectTimeout
	f.urlSrc = defineURL(o, &f.url, urlHelp)
	o.Duration(&f.ttl, "", "ttl", "DUR", "lease length (default 30s), renewed every TTL/3 (zk://: the lease follows the session timeout instead)")
	o.Bool(&f.shared, "s", "shared", "take a shared (read) lock: held together with other --shared holders, never with an exclusive one")
	o.Var(limitFlag{&f.limit}, "", "limit", "N", fmt.Sprintf("take one of N permits (a semaphore): at most N --limit N holders of KEY at once; N in 1-%d", dlock.MaxLimit))
	o.Var(waitFlag{&f.wait, &f.waitSet}, "w", "wait", "DUR|SECS", "give up after waiting this long: a duration (2m, 1.5s) or seconds (5, 0.5); 0 means one attempt, like -n (default: wait for ever)")
	o.Bool(&f.nonblock, "n", "nonblock", "fail at once if the lock is held (one attempt)")
	o.Int(&f.conflict, "E", "conflict-exit-code", "N", "exit status when the lock is held by someone else (default 1)")
	o.Duration(&f.maxHold, "", "max-hold", "DUR", "give the lock up once it has been held this long, renewals included (default: no cap)")
}

// defineLast adds the options listed after the command's own: the
// connection's and --verbose, which says verboseHelp.
func (f *lockFlags) defineLast(o *optionSet, verboseHelp string) {
	o.Duration(&f.connect, "", "connect-timeout", "DUR", "bound on connecting to and probing the lock service, and on the first lock request when -n or a shorter --wait is given (default 5s)")
	o.Bool(&f.verbose, "", "verbose", verboseHelp)
}

// request checks f for `dlock o.cmd KEY` and returns what to ask for; a
// problem is a usage error, printed, with ok false.
func (f *lockFlags) request(o *optionSet, key string, stderr io.Writer) (r acquireRequest, ok bool) {
	if err := f.urlSrc.check(); err != nil {
		o.UsageError(stderr, "%v", err)
		return r, false
	}
	switch {
	case f.ttl <= 0:
		o.UsageError(stderr, "--ttl must be positive, got %v", f.ttl)
		return r, false
	case f.ttl < dlock.MinTTL:
		o.UsageError(stderr, "--ttl %v is below the minimum, %v", f.ttl, dlock.MinTTL)
		return r, false
	case f.ttl > dlock.MaxTTL:
		// Checked here, before connecting, for the usage error's two lines.
		o.UsageError(stderr, "--ttl %v is above the maximum, %v", f.ttl, dlock.MaxTTL)
		return r, false
	case f.connect <= 0:
		o.UsageError(stderr, "--connect-timeout must be positive, got %v", f.connect)
		return r, false
	case f.conflict < 0 || f.conflict > 255:
		o.UsageError(stderr, "--conflict-exit-code must be in 0-255, got %d", f.conflict)
		return r, false
	case f.shared && f.limit > 0:
		o.UsageError(stderr, "--shared and --limit %d cannot be combined: a key is a read-write lock or a semaphore, not both", f.limit)
		return r, false
	case f.maxHold < 0:
		o.UsageError(stderr, "--max-hold must not be negative, got %v", f.maxHold)
		return r, false
	case f.maxHold > 0 && f.maxHold < minMaxHold(f.ttl):
		o.UsageError(stderr, "--max-hold %v is below the minimum, %v (with --ttl %v)", f.maxHold, minMaxHold(f.ttl), f.ttl)
		return r, false
	}
	if err := dlock.ValidateKey(key); err != nil {
		o.UsageError(stderr, "%s", errText(err))
		return r, false
	}
	r = acquireRequest{cmd: o.cmd, key: key, ttl: f.ttl, wait: f.wait, nonblock: f.nonblock, conflict: f.conflict, maxHold: f.maxHold,
		attempt: f.connect, mode: dlock.Exclusive, verbose: f.verbose, progress: f.verbose && stderrIsForegroundTerminal()}
	if f.waitSet && f.wait == 0 {
		r.nonblock = true // -w 0 fails at once, as flock(1)'s does
	}
	switch {
	case f.shared:
		r.mode = dlock.Shared
	case f.limit > 0:
		r.mode, r.limit = dlock.Limited, f.limit
	}
	return r, true
}

// minMaxHold is the shortest --max-hold with --ttl ttl: MinTTL, and above
// the lease's clock-drift allowance (the library's default, which the
// cap's deadline is counted with).
func minMaxHold(ttl time.Duration) time.Duration {
	drift := time.Duration(float64(ttl)*dlock.DefaultDriftFactor) + dlock.DefaultDriftMin
	return max(dlock.MinTTL, drift+time.Millisecond)
}

// graceFlag is --grace, a duration; set records that it was given.
type graceFlag struct {
	d   *time.Duration
	set *bool
}

func (f graceFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f graceFlag) Set(s string) error {
	if err := (*durationValue)(f.d).Set(s); err != nil {
		return err
	}
	*f.set = true
	return nil
}

// shellFlag is -c: a command line for /bin/sh -c; set records that it
// was given (an empty one is refused).
type shellFlag struct {
	cmd *string
	set *bool
}

func (f shellFlag) String() string {
	if f.cmd == nil {
		return ""
	}
	return *f.cmd
}

func (f shellFlag) Set(s string) error {
	if *f.set {
		return errors.New("-c given twice")
	}
	if strings.TrimSpace(s) == "" {
		return errors.New("an empty command")
	}
	*f.cmd, *f.set = s, true
	return nil
}

// waitFlag parses --wait as a duration ("2m", "1.5s") or as seconds
// ("30", "0.5"), like flock(1)'s -w; set records that it was given (so
// that -w 0 can mean one attempt while no -w means for ever). Negative,
// not-a-number and too long waits are refused.
type waitFlag struct {
	d   *time.Duration
	set *bool
}

func (w waitFlag) String() string {
	if w.d == nil || *w.d == 0 {
		return ""
	}
	return w.d.String()
}

func (w waitFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, perr := strconv.ParseFloat(s, 64)
		if perr != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return fmt.Errorf("want a duration (2m, 1.5s) or a number of seconds (5, 0.5)")
		}
		if math.Abs(secs) > float64(math.MaxInt64/int64(time.Second)) {
			return fmt.Errorf("too long: at most %d seconds", math.MaxInt64/int64(time.Second))
		}
		d = time.Duration(secs * float64(time.Second))
		if d == 0 && secs > 0 {
			d = 1 // below a nanosecond: still a (short) wait, not -w 0
		}
	}
	if d < 0 {
		return fmt.Errorf("must not be negative")
	}
	*w.d, *w.set = d, true
	return nil
}

// limitFlag parses --limit: a whole number of permits in
// [1, dlock.MaxLimit]. Anything else is a usage error (the flag package
// reports it with the flag's name), never a value passed on.
type limitFlag struct{ n *int }

func (f limitFlag) String() string {
	if f.n == nil || *f.n == 0 {
		return ""
	}
	return strconv.Itoa(*f.n)
}

func (f limitFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > dlock.MaxLimit {
		return fmt.Errorf("want a number of permits in 1-%d", dlock.MaxLimit)
	}
	*f.n = int(n)
	return nil
}
