package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
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
