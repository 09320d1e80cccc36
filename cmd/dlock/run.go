package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

const runUsage = `Usage: dlock run [--url URL|--url-file PATH] [--ttl 30s]
         [-s|--shared | --limit N]
         [-w|--wait DUR|SECS] [-n|--nonblock] [-E|--conflict-exit-code N]
         [--grace 5s] [--max-hold DUR] [--metrics-file PATH] [--metrics ADDR]
         [--connect-timeout 5s] [--verbose] KEY [--] CMD [ARGS...]
  or:  dlock run [OPTION]... KEY -c CMDLINE

Runs CMD while holding the lock KEY, renewing it automatically. CMD sees
DLOCK_KEY, DLOCK_TOKEN (the fencing token: pass it to whatever CMD writes to),
DLOCK_OWNER and DLOCK_MODE (exclusive, shared or limited; DLOCK_LIMIT too
with --limit). When CMD exits the lock is released and dlock exits with
CMD's status (128+N if CMD was killed by signal N). CMD inherits dlock's
environment but for a DLOCK_URL holding a password (or another secret
option), which CMD never sees: a dlock that CMD runs then needs --url or
--url-file, and refuses without one rather than use the file backend.
With -c (like flock -c) the command is one string run by /bin/sh -c, so
that it can use the variables: dlock run deploy -c 'echo token $DLOCK_TOKEN'.

CMD runs in its own process group under a small supervisor process that
keeps track of every process CMD starts, even ones that leave the group.
SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to dlock are forwarded to CMD's
process group. On a terminal, CMD's group gets the terminal's foreground, so
Ctrl-C reaches it once. Processes CMD leaves running when it exits get
SIGTERM, then SIGKILL after --grace, before the lock is released (unless
the lease runs short first: then the schedule below applies). If dlock is
killed, even with SIGKILL, the whole tree is killed.

Modes: by default the lock is exclusive: one holder at a time. With
--shared (-s) it is a read lock, like flock -s: any number of --shared runs
hold KEY together, and no exclusive one; once an exclusive run is waiting,
new --shared runs wait behind it, so that readers cannot starve a writer.
With --limit N it is one of N permits, a semaphore like consul lock -n N:
at most N --limit N runs hold KEY at once. Every run of a key must use the
same N: a run with another limit than the current holders' fails (exit 2),
and so does a mode the backend does not offer. Runs of different modes
exclude each other. Every holder, in any mode, has its own lease and its
own fencing token, above every earlier holder's.

Waiting: without -w dlock waits for the lock for ever; -w D gives up once D
has passed: D is a duration (2m, 1.5s) or, as with flock -w, a number of
seconds (5, 0.5); -n or -w 0 makes a single attempt. Connecting to the lock
service is bounded by --connect-timeout, and so is the first attempt when
-n or a shorter -w is given: even -w 1us gets one whole attempt. With
--verbose dlock says who holds the lock when it has to wait ("waiting for
KEY, held by owner ... on HOST pid PID, lease ends in 4.2s"), and how long
it waited once it has the lock ("acquired KEY after 3.0s, token N"); on a
terminal a progress line counts the seconds of a long wait.

The whole tree is dead before the lease can pass to anyone else: it is
SIGKILLed at the kill point, TTL/10 (at most 1s) before the lease's local
deadline, which itself comes before the server lets the lease go. If the
lease is not renewed in time (the lock service unreachable or hung, dlock
stopped), every process of the tree gets SIGTERM, once, --grace before the
kill point; and if the lock is lost outright (key deleted), SIGTERM at
once, SIGKILL --grace later or at the kill point, whichever comes first.
dlock says so on stderr and exits 4. SIGTERM never goes out more than TTL/3
before the deadline, a whole renewal interval: a longer --grace is
shortened to fit (TTL/3 less the kill margin; 700ms at --ttl 3s, 9s at the
default 30s), with a warning on stderr if --grace was given. Once SIGTERM
went out because the lease ran short, the tree is killed at the kill point
even if a late renewal comes through. A supervisor process keeps the
deadline as well as dlock, so the same holds if dlock itself stops
renewing without dying (SIGSTOP, SIGTSTP, a long stall); dlock exits 4 once
it runs again.

Metrics: --metrics-file PATH writes Prometheus metrics to PATH in the text
format of node_exporter's textfile collector (name it NAME.prom in the
collector's directory) when the lock is acquired, after renewals (at most
once per TTL/3), when it is lost, and on exit. Each write replaces PATH by
a rename: a reader never sees part of one. The file has dlockprom's
metrics of the lock (dlock_acquire_total, dlock_locks_held,
dlock_renew_total, dlock_lost_total by reason, ...) and
dlock_run_last_exit_code, dlock_run_last_lost (1 if the lock was lost),
dlock_run_last_held_seconds and the start, acquisition and end times
(dlock_run_last_*_timestamp_seconds), labelled by backend, key and
key_class (the key too).
--metrics ADDR serves the same at http://ADDR/metrics while dlock runs.
An ADDR dlock cannot listen on, or a PATH it cannot write, is a usage
error (exit 2), found before the lock is asked for.
`

const runExitCodes = `
Exit status:
  CMD's status   CMD ran and the lock stayed held
  1              the lock is held by someone else (-n, or --wait elapsed);
                 see -E
  2              usage error: bad flags, arguments or URL, a mode the backend
                 does not offer (--shared, --limit), or a --limit other than
                 the current holders'
  3              backend error: unreachable server, no answer, TLS or
                 authentication failure... (whatever -w and -n say)
  4              the lock was lost while CMD ran, or --max-hold was
                 reached; CMD was terminated
  126            CMD was found but could not be executed (no execute
                 permission, a directory, not an executable format)
  127            CMD was not found
  128+N          interrupted by signal N while waiting for the lock

Examples:
  dlock run nightly-report -- ./report.sh
  dlock run -n -E 75 --url redis://127.0.0.1:6379 deploy -- make deploy
  dlock run -w 5 --ttl 10s inventory -c 'echo token $DLOCK_TOKEN'
  dlock run --verbose --wait 2m backup -- ./backup.sh
  dlock run --shared catalog -- ./read-catalog.sh   # readers overlap
  dlock run catalog -- ./rebuild-catalog.sh         # the writer waits
  dlock run --limit 3 --url redis://127.0.0.1:6379 encoders -- ./encode.sh
  dlock run --metrics-file /var/lib/node_exporter/nightly.prom nightly -- \
      ./report.sh
`

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

func cmdRun(args []string, stdout, stderr io.Writer) int {
	o := newOptions("run", runUsage)
	o.Trailer(runExitCodes)
	var (
		lf       lockFlags
		mf       metricsFlags
		shellC   string
		shellOn  bool
		grace    = 5 * time.Second
		graceSet bool // --grace given: say so if it is shortened
	)
	lf.define(o)
	o.Var(shellFlag{&shellC, &shellOn}, "c", "command", "CMDLINE", "run this command line with /bin/sh -c instead of CMD [ARGS...] (like flock -c); it may also come right after KEY")
	o.Var(graceFlag{&grace, &graceSet}, "", "grace", "DUR", "time between SIGTERM and SIGKILL for processes CMD leaves behind, and when the lock is lost or its lease runs short (there at most TTL/3 less the kill margin, TTL/10 up to 1s) (default 5s)")
	mf.define(o)
	lf.defineLast(o, "say who holds the lock while waiting and how long the wait took; print the process tree's pids, the lock's events (acquired, renewal failures, lost, released) and the client libraries' logs on stderr")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if len(rest) == 0 {
		return o.UsageError(stderr, "missing KEY")
	}
	key, cmdArgs := rest[0], rest[1:]
	// flock's form: KEY -c CMDLINE (also -cCMDLINE, -c=CMDLINE, --command
	// CMDLINE, --command=CMDLINE, as before KEY).
	if len(cmdArgs) > 0 {
		a, name, val, isC, hasVal := cmdArgs[0], "", "", false, false
		switch {
		case a == "-c" || a == "--command":
			name, isC = a, true
		case strings.HasPrefix(a, "--command="):
			name, val, isC, hasVal = "--command", strings.TrimPrefix(a, "--command="), true, true
		case strings.HasPrefix(a, "-c"):
			name, val, isC, hasVal = "-c", strings.TrimPrefix(a[2:], "="), true, true
		}
		if isC {
			if shellOn {
				return o.UsageError(stderr, "-c given twice")
			}
			switch {
			case hasVal:
				cmdArgs = cmdArgs[1:]
			case len(cmdArgs) < 2:
				return o.UsageError(stderr, "option %s needs a value (CMDLINE)", name)
			default:
				val, cmdArgs = cmdArgs[1], cmdArgs[2:]
			}
			if err := (shellFlag{&shellC, &shellOn}).Set(val); err != nil {
				return o.UsageError(stderr, "invalid value %q for %s: %v", val, name, err)
			}
		}
	}
	if len(cmdArgs) > 0 && cmdArgs[0] == "--" {
		cmdArgs = cmdArgs[1:]
	}
	if grace < 0 {
		return o.UsageError(stderr, "--grace must not be negative, got %v", grace)
	}
	switch {
	case shellOn && len(cmdArgs) > 0:
		return o.UsageError(stderr, "both -c CMDLINE and CMD given (%s): give one", oneLine(strings.Join(cmdArgs, " ")))
	case shellOn:
		cmdArgs = []string{"/bin/sh", "-c", shellC}
	case len(cmdArgs) == 0:
		return o.UsageError(stderr, "missing CMD after KEY -- (or -c CMDLINE)")
	}
	r, ok := lf.request(o, key, stderr)
	if !ok {
		return exitUsage
	}
	if lf.maxHold > 0 {
		// CMD gets SIGTERM the kill margin and the term grace before the
		// cap's deadline: a cap below both would end CMD as it starts.
		k, _ := newKillSchedule(lf.ttl, grace)
		if least := minMaxHold(lf.ttl) + k.margin + k.termGrace; lf.maxHold < least {
			return o.UsageError(stderr, "--max-hold %v leaves CMD no time: it gets SIGTERM %v before the cap (kill margin %v, term grace %v); the minimum with --ttl %v and --grace %v is %v",
				lf.maxHold, (k.margin + k.termGrace).Round(time.Millisecond), k.margin.Round(time.Millisecond), k.termGrace.Round(time.Millisecond), lf.ttl, grace, least.Round(time.Millisecond))
		}
	}
	m, ok := mf.start(o, r, lf.url, stderr)
	if !ok {
		return exitUsage
	}
	r.observer = m.observer()
	// Signals: while waiting they cancel the wait; while CMD runs they are
	// forwarded to it.
	h, code := takeLock(&lf, r, []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}, stderr)
	if h == nil {
		return m.exit(code, nil)
	}
	defer h.close()
	holdCap := newHoldCap(h.lk, lf.maxHold)
	status := superviseChild(h.lk, cmdArgs, runOptions{grace: grace, graceSet: graceSet, verbose: lf.verbose, mode: r.mode, limit: r.limit}, h.sigc, h.stderr)
	if status == exitLost && holdCap.reached(h.lk) {
		// The lease was renewed up to the cap only: CMD's tree was ended
		// as for a lost lock, before the lease could pass on.
		fmt.Fprintf(h.stderr, "dlock run: --max-hold %s reached: the lock was given up and CMD's process tree terminated\n", lf.maxHold)
		m.capReached()
	}
	return m.exit(status, h.lk)
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

// waitingText is --verbose's line when the first attempt did not get the
// lock: "waiting for "k", held by owner 3f2a01c2d4e5 on web-1 pid 42,
// lease ends in 4.2s", as far as that attempt saw.
func waitingText(r acquireRequest, err error) string {
	if !heldBySomeone(err) {
		return fmt.Sprintf("waiting for %q; the first attempt got no answer: %s", r.key, oneLine(err.Error()))
	}
	var na *dlock.NotAcquiredError
	h, seen := dlock.Holder{}, false
	if errors.As(err, &na) {
		h, seen = seenHolder(na)
	}
	if !seen {
		if r.mode == dlock.Shared {
			return fmt.Sprintf("waiting for %q, held, or an exclusive run is waiting for it (new shared runs wait behind it)", r.key)
		}
		return fmt.Sprintf("waiting for %q, held", r.key)
	}
	how := "held"
	switch h.Mode {
	case dlock.Shared:
		how = "held shared"
	case dlock.Limited:
		how = "held as a semaphore"
	}
	msg := fmt.Sprintf("waiting for %q, %s by %s", r.key, how, holderWords(h))
	if n := len(na.Holders); n > 1 {
		msg += fmt.Sprintf(" and %d other holder(s)", n-1)
	}
	if h.TTL > 0 {
		msg += fmt.Sprintf(", lease ends in %s", h.TTL.Round(100*time.Millisecond))
	}
	return msg
}

// holderWords names a holder in prose: "owner 3f2a01c2d4e5 on web-1 pid
// 42", control characters escaped.
func holderWords(h dlock.Holder) string {
	var parts []string
	if h.Owner != "" {
		short := h.Owner
		if len(short) > 12 {
			short = short[:12]
		}
		parts = append(parts, "owner "+oneLine(short))
	}
	if host := h.Metadata[dlock.MetaHost]; host != "" {
		parts = append(parts, "on "+oneLine(host))
	}
	if pid := h.Metadata[dlock.MetaPID]; pid != "" {
		parts = append(parts, "pid "+oneLine(pid))
	}
	if len(parts) == 0 {
		return "a holder that left no name"
	}
	return strings.Join(parts, " ")
}

// progressHolder is the progress line's note on who held the lock at the
// first attempt ("" if nobody was named).
func progressHolder(err error) string {
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		return ""
	}
	if h, ok := seenHolder(na); ok && (h.Owner != "" || len(h.Metadata) > 0) {
		return " (held by " + holderWords(h) + " at the first attempt)"
	}
	return ""
}

// Progress line of a long wait on a terminal: from progressAfter on, once
// every progressEvery, "\rdlock run: waiting 5s for "k" (held by ...)",
// rewritten in place; cleared once the wait is over.
const (
	progressAfter = 2 * time.Second
	progressEvery = time.Second
)

// progressWriter is stderr while a progress line may be drawn on it:
// anything else written to it (a message, a log line of --verbose) first
// erases the progress line, which the next tick draws again.
type progressWriter struct {
	mu    sync.Mutex
	w     io.Writer
	drawn bool
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
	return p.w.Write(b)
}

// draw replaces the progress line with line.
func (p *progressWriter) draw(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// \x1b[K erases the rest of the line: a shorter line leaves nothing
	// of the last one behind.
	writeControl(p.w, "\r"+line+"\x1b[K")
	p.drawn = true
}

// erase erases the progress line, if drawn.
func (p *progressWriter) erase() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
}

func (p *progressWriter) eraseLocked() {
	if p.drawn {
		writeControl(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

// showProgress draws the progress line on p until the returned stop is
// called; stop erases it, if it is drawn, before it returns.
func showProgress(p *progressWriter, name, key, held string, start time.Time) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if waited := time.Since(start); waited >= progressAfter {
					p.draw(fmt.Sprintf("%s: waiting %s for %q%s", name, waited.Round(time.Second), key, held))
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		p.erase()
	}
}

// writeControl writes s, whose control characters are dlock's own (any
// text from elsewhere in it escaped already), to w; through a scrubWriter
// it is scrubbed of secrets but not escaped.
func writeControl(w io.Writer, s string) {
	if sw, ok := w.(*scrubWriter); ok {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		io.WriteString(sw.w, scrub(s, sw.secrets))
		return
	}
	io.WriteString(w, s)
}

// stderrIsForegroundTerminal reports whether fd 2 is a terminal whose
// foreground is dlock's process group: there a progress line can be drawn
// and erased (from the background, with "stty tostop", writing would stop
// dlock). Outside Linux it says no.
func stderrIsForegroundTerminal() bool {
	pg, err := tcgetpgrp(2)
	return err == nil && pg == syscall.Getpgrp()
}

// heldText says who holds r.key, from the holders na names: "lock "k" is
// held shared by owner 3f2a… (host=web-1 pid=42) and 2 other holder(s),
// lease ends in 4.2s". For a --limit run refused by holders of the same
// limit it says that all the permits are taken; for a --shared run
// refused by shared holders, that a writer is waiting (writer preference).
func heldText(r acquireRequest, na *dlock.NotAcquiredError) string {
	h, ok := seenHolder(na)
	if !ok {
		if r.mode == dlock.Shared {
			return fmt.Sprintf("lock %q is held, or an exclusive run is waiting for it (new shared runs wait behind it)", r.key)
		}
		return fmt.Sprintf("lock %q is held", r.key)
	}
	// allOf: every holder named (by owner or metadata) holds in mode m,
	// and there is one.
	allOf := func(m dlock.Mode) bool {
		named := 0
		for _, x := range na.Holders {
			if x.Owner != "" || len(x.Metadata) > 0 {
				if x.Mode != m {
					return false
				}
				named++
			}
		}
		return named > 0
	}
	var msg string
	switch {
	case r.mode == dlock.Limited && allOf(dlock.Limited):
		msg = fmt.Sprintf("all %d permits of lock %q are held", r.limit, r.key)
	case h.Mode == dlock.Shared:
		msg = fmt.Sprintf("lock %q is held shared", r.key)
	case h.Mode == dlock.Limited:
		msg = fmt.Sprintf("lock %q is held as a semaphore", r.key)
	default:
		msg = fmt.Sprintf("lock %q is held", r.key)
	}
	if h.Owner != "" || len(h.Metadata) > 0 {
		msg += " by " + holderText(h.Owner, h.Metadata)
	}
	if n := len(na.Holders); n > 1 {
		msg += fmt.Sprintf(" and %d other holder(s)", n-1)
	}
	if h.TTL > 0 {
		msg += fmt.Sprintf(", lease ends in %s", h.TTL.Round(time.Millisecond))
	}
	if r.mode == dlock.Shared && allOf(dlock.Shared) {
		msg += "; an exclusive run is waiting for it, and new shared runs wait behind it"
	}
	return msg
}

// acquireErrorStatus maps an acquisition error to dlock's exit status: the
// conflict status only when the error wraps dlock.ErrNotAcquired and a
// holder was actually observed (its owner, metadata or lease); anything
// else, an outage or a wait that ended without any answer, is a backend
// error (3) whatever -w and -n say. A mode the backend does not offer and
// a --limit other than the current holders' are usage errors (2): asking
// again will not help.
// evicts reports a Redis refused because it may evict lock keys.
func evicts(err error) bool {
	var re *redislock.EvictionError
	var rl *redlock.EvictionError
	return errors.As(err, &re) || errors.As(err, &rl)
}

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

// heldBySomeone reports whether err says that the key is held: it wraps
// dlock.ErrNotAcquired and names an owner, metadata or a lease, or it is
// the service's own refusal (no Cause: not a wait that ended), which may
// name nobody: a shared request refused for a waiting writer once the
// readers are gone, a holder PostgreSQL's snapshot did not show.
func heldBySomeone(err error) bool {
	if !errors.Is(err, dlock.ErrNotAcquired) {
		return false
	}
	var na *dlock.NotAcquiredError
	if !errors.As(err, &na) {
		return true
	}
	_, ok := seenHolder(na)
	return ok || na.Cause == nil
}

// seenHolder returns the first holder na names that was actually seen:
// one with an owner, metadata or a lease.
func seenHolder(na *dlock.NotAcquiredError) (dlock.Holder, bool) {
	for _, h := range na.Holders {
		if h.Owner != "" || len(h.Metadata) > 0 || h.TTL > 0 {
			return h, true
		}
	}
	return dlock.Holder{}, false
}

// runOptions are dlock run's settings for the process tree.
type runOptions struct {
	grace    time.Duration
	graceSet bool // --grace given: say so if it is shortened
	verbose  bool
	mode     dlock.Mode // the lock's, for DLOCK_MODE
	limit    int        // --limit N, for DLOCK_LIMIT
}

// superviseChild runs CMD under lk (see supervise.go for the process tree)
// and returns dlock's exit status.
func superviseChild(lk *dlock.Lock, cmdArgs []string, o runOptions, sigc chan os.Signal, stderr io.Writer) int {
	release := func() { releaseNow("dlock run", lk, stderr) }
	// The schedule follows the lease granted (zk://: from the session
	// timeout, not --ttl).
	kill, clamped := newKillSchedule(lk.TTL(), o.grace)
	if clamped && o.graceSet {
		fmt.Fprintf(stderr, "dlock run: --grace %s does not fit in a %s lease: CMD gets SIGTERM %s before SIGKILL when the lease runs short or the lock is lost (at most a third of the lease less the %s kill margin); --grace %s still applies to what CMD leaves running when it exits\n",
			o.grace, lk.TTL(), kill.termGrace.Round(time.Millisecond), kill.margin.Round(time.Millisecond), o.grace)
	}
	// Orphans of the tree come to dlock if the supervisor dies.
	_ = setSubreaper()
	contc := make(chan os.Signal, 1)
	signal.Notify(contc, syscall.SIGCONT)
	defer signal.Stop(contc)
	// An outer dlock run's DLOCK_LIMIT must not describe this lock, and
	// CMD gets no password: a DLOCK_URL holding a secret is left out.
	// A dlock that CMD starts without --url then refuses to run
	// (urlWithheldEnv) instead of locking on the local file backend.
	withheld := false
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		if strings.HasPrefix(kv, "DLOCK_URL=") && hasSecret(strings.TrimPrefix(kv, "DLOCK_URL=")) {
			withheld = true
			return true
		}
		return strings.HasPrefix(kv, "DLOCK_LIMIT=") || strings.HasPrefix(kv, urlWithheldEnv+"=")
	})
	if withheld {
		env = append(env, urlWithheldEnv+"=1")
	}
	env = append(env,
		"DLOCK_KEY="+lk.Key(),
		"DLOCK_TOKEN="+strconv.FormatUint(lk.Token(), 10),
		"DLOCK_OWNER="+lk.Owner(),
		"DLOCK_MODE="+o.mode.String(),
	)
	if o.mode == dlock.Limited {
		env = append(env, "DLOCK_LIMIT="+strconv.Itoa(o.limit))
	}
	// The supervisor enforces the lease deadline itself, in case dlock
	// stops renewing without dying (SIGSTOP); it learns each new one.
	sentDeadline := lk.Deadline()
	sup, err := startSupervisor(cmdArgs, env, kill, leaseDeadline(lk))
	if err != nil {
		release()
		fmt.Fprintf(stderr, "dlock run: cannot start the supervisor: %v\n", err)
		return exitNoExec
	}
	defer sup.killTree()
	// dlock writes to the terminal from the background while CMD has it;
	// with "stty tostop" that would stop dlock (and its renewals). Only
	// now: the supervisor and CMD must not inherit the ignored signal.
	signal.Ignore(syscall.SIGTTOU)

	status := -1 // CMD's status once known
	lost := lk.Lost()
	var killTimer <-chan time.Time
	var killAfter time.Duration // killTimer's delay
	lostLock := false
	saidLost := false // "LOCK LOST" is on stderr
	expired := false  // the supervisor found the lease run out
	started := false  // CMD was started
	// Renewals move the deadline every ttl/3; look often enough that the
	// supervisor's copy is never far behind: its term point can come as
	// early as ttl/3 before the deadline.
	leaseTick := time.NewTicker(min(max(lk.TTL()/16, 5*time.Millisecond), 250*time.Millisecond))
	defer leaseTick.Stop()
	for {
		select {
		case <-leaseTick.C:
			if d := lk.Deadline(); lost != nil && d.After(sentDeadline) {
				sentDeadline = d
				sup.send("lease %d", leaseDeadline(lk))
			}
		case sig := <-sigc:
			if status >= 0 {
				sup.killTree() // CMD is gone: a signal hurries its leftovers up
				continue
			}
			if s, ok := sig.(syscall.Signal); ok {
				sup.send("sig %d", int(s))
			}
		case <-contc:
			// fg or bg after a stop: CMD goes on, in the terminal's
			// foreground if dlock is there.
			sup.send("cont")
		case <-lost:
			lost = nil
			lostLock, saidLost = true, true
			// SIGKILL after the term grace, and at the kill point at the
			// latest.
			killIn := min(kill.termGrace, max(0, time.Until(lk.Deadline())-kill.margin))
			if expired || time.Until(sentDeadline) <= kill.margin+kill.termGrace {
				// Past the term point: the supervisor has sent SIGTERM
				// (or is sending it) and said so; it kills at the kill
				// point.
				fmt.Fprintf(stderr, "dlock run: LOCK LOST: %v\n", lk.Err())
			} else {
				fmt.Fprintf(stderr, "dlock run: LOCK LOST: %v; sending SIGTERM to CMD's process tree (SIGKILL in %s)\n", lk.Err(), killIn.Round(time.Millisecond))
			}
			sup.send("term") // the supervisor sends it once, whoever asks
			if killTimer == nil {
				killTimer, killAfter = time.After(killIn), killIn
			}
		case <-killTimer:
			killTimer = nil
			if killAfter < time.Millisecond {
				// Lost at or past the kill point: there was no term grace.
				fmt.Fprintf(stderr, "dlock run: the lease's kill point has passed; sending SIGKILL to CMD's process tree\n")
			} else {
				fmt.Fprintf(stderr, "dlock run: CMD's process tree still running after %s; sending SIGKILL\n", killAfter.Round(time.Millisecond))
			}
			sup.killTree()
		case ev := <-sup.events:
			switch ev.kind {
			case "pid":
				started = true
				if o.verbose {
					fmt.Fprintf(stderr, "dlock run: CMD is pid %d (process group %d), supervisor pid %d\n", ev.n, ev.n, sup.cmd.Process.Pid)
				}
			case "noexec":
				fmt.Fprintf(stderr, "dlock run: %s\n", ev.msg)
				status = ev.n
			case "exit":
				status = ev.n
			case "expired":
				// No newer deadline reached the supervisor by the term
				// point (renewals failed, or dlock was stopped): it
				// terminates the tree on its own, and said so.
				expired, lostLock = true, true
			case "stop":
				// CMD was stopped from the terminal (Ctrl-Z), which is ours
				// again: stop too, so that the shell sees the job stop.
				if !lostLock {
					fmt.Fprintf(stderr, "dlock run: stopped: the lease of %q is not renewed while stopped; CMD's process tree is terminated in %s unless continued\n", lk.Key(), max(0, time.Until(lk.Deadline())-kill.margin-kill.termGrace).Round(time.Second))
					_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
				}
			case "done":
				// Whatever of the tree outlived the supervisor was
				// re-parented to dlock: it dies before the lock is
				// released. Normally there is nothing.
				killed, left := sweepOrphans()
				if lostLock && !saidLost && started {
					// The supervisor killed the tree at the kill point,
					// before the local deadline: dlock's renewals may not
					// have failed for good yet.
					if err := lk.Err(); err != nil {
						fmt.Fprintf(stderr, "dlock run: LOCK LOST: %v\n", err)
					} else {
						fmt.Fprintf(stderr, "dlock run: LOCK LOST: the lease of %q was not renewed in time; CMD's process tree was killed before the lease could pass on\n", lk.Key())
					}
				}
				switch {
				case status < 0 && expired && !started:
					fmt.Fprintf(stderr, "dlock run: the lease of %q ran out before CMD could be started; CMD did not run\n", lk.Key())
				case status < 0:
					// The supervisor died without a word (SIGKILL, OOM):
					// CMD got its parent-death SIGKILL.
					fmt.Fprintf(stderr, "dlock run: the supervisor died (%v); CMD was killed, and %d leftover processes\n", ev.err, len(killed))
					status = 128 + int(syscall.SIGKILL)
				case len(killed) > 0:
					fmt.Fprintf(stderr, "dlock run: the supervisor died (%v) while processes CMD left still ran; killed %d of them (pid %s)\n", supervisorEnd(ev.err), len(killed), pidList(killed))
				}
				if len(left) > 0 {
					// Never release while part of the tree may run: the
					// lease runs out on its own.
					fmt.Fprintf(stderr, "dlock run: could not kill pid %s; not releasing %q (its lease ends within %s)\n", pidList(left), lk.Key(), lk.TTL())
					if lostLock {
						return exitLost
					}
					return status
				}
				release()
				if lostLock {
					return exitLost
				}
				return status
			}
		}
	}
}

// supervisorEnd describes how the supervisor ended, from its Wait error.
func supervisorEnd(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// reportOpen prints a backend-open error and returns the exit status.
func reportOpen(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "dlock %s: %v\n", cmd, err)
	if errors.Is(err, errBadURL) || errors.Is(err, dlock.ErrInvalidOption) {
		return exitUsage
	}
	return exitBackend
}

// releaseNow releases lk with its own bounded context.
func releaseNow(name string, lk *dlock.Lock, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
	defer cancel()
	if err := lk.Release(ctx); err != nil && !errors.Is(err, dlock.ErrLockLost) {
		fmt.Fprintf(stderr, "%s: release %q: %v\n", name, lk.Key(), err)
	}
}
