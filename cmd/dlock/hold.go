package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
)

const holdUsage = `Usage: dlock hold [--url URL|--url-file PATH] [--ttl 30s]
         [-s|--shared | --limit N]
         [-w|--wait DUR|SECS] [-n|--nonblock] [-E|--conflict-exit-code N]
         [--detach | --parent PID] [--max-hold DUR]
         [--metrics-file PATH] [--metrics ADDR]
         [--connect-timeout 5s] [--verbose] KEY

Takes the lock KEY and holds it, renewing it, until dlock hold gets SIGINT,
SIGTERM, SIGHUP or SIGQUIT, or the process that started it exits: then it
releases the lock and exits 0. If that process exits while dlock hold
still waits for the lock, it stops waiting and exits 0 holding nothing;
if it is gone already when dlock hold starts (its parent is init), dlock
hold refuses (exit 2). With --parent PID it watches process PID instead of
its parent (a container's entrypoint is pid 1, which dlock hold otherwise
takes for init). With --detach it outlives that process and holds the
lock until a signal (use it to run dlock hold as a service). With
--max-hold DUR it releases the lock once held for DUR and exits 5. It runs no
command (like etcdctl lock without one): once the lock is held it prints
one line on stdout, TOKEN OWNER: the fencing token and the owner id,

  42 3f2a01c2d4e5f60718293a4b5c6d7e8f

and holds the lock for whatever the caller does meanwhile, such as a shell
script that takes a lock across several commands. Pass the token to what
you write to, so that it can refuse a stale holder's writes.

If the lock is lost while held (renewal failed, key deleted, dlock hold
stopped for longer than the lease), it says so on stderr and exits 4: from
then on the lock may be someone else's. Waiting (-w, -n), modes (--shared,
--limit), metrics (--metrics-file, --metrics) and the URL work as for dlock
run; see 'dlock run --help'.
`

const holdExitCodes = `
Exit status:
  0       the lock was held until a signal, or until the process that
          started dlock hold exited, and then released (or, that process
          gone while waiting, never taken)
  1       the lock is held by someone else (-n, or --wait elapsed); see -E
  2       usage error: bad flags, arguments or URL, a mode the backend does
          not offer, or a --limit other than the current holders'; also
          when the process that started dlock hold is already gone (its
          parent is init) and --detach was not given
  3       backend error (unreachable, no answer, authentication), also when
          the release on a signal failed (the lease then runs out on its own)
  4       the lock was lost while held
  5       --max-hold was reached: the lock was released
  128+N   interrupted by signal N while waiting for the lock

Examples:
  dlock hold -w 30 deploy
  # bash: hold the lock while the rest of a script runs
  coproc dlock hold deploy
  read -r token owner <&"${COPROC[0]}"    # returns once the lock is held
  ./deploy.sh --fencing-token "$token"
  kill "$COPROC_PID"; wait "$COPROC_PID"  # release
`

func cmdHold(args []string, stdout, stderr io.Writer) (code int) {
	o := newOptions("hold", holdUsage)
	o.Trailer(holdExitCodes)
	var lf lockFlags
	var mf metricsFlags
	var (
		detach bool
		parent int
	)
	lf.define(o)
	o.Bool(&detach, "", "detach", "keep holding after the process that started dlock hold exits (by default dlock hold then releases the lock and exits, so that a killed script does not leave it held)")
	o.Var(pidFlag{&parent}, "", "parent", "PID", "release the lock and exit when process PID exits, instead of the process that started dlock hold (for a script run as pid 1, such as a container's entrypoint: --parent $$)")
	mf.define(o)
	lf.defineLast(o, "say who holds the lock while waiting and how long the wait took; print the lock's events (acquired, renewal failures, lost, released) and the client libraries' logs on stderr")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	switch {
	case len(rest) == 0:
		return o.UsageError(stderr, "missing KEY")
	case len(rest) > 1:
		return o.UsageError(stderr, "unexpected argument after KEY: %s (to run a command under the lock, use dlock run)", oneLine(strings.Join(rest[1:], " ")))
	}
	if detach && parent != 0 {
		return o.UsageError(stderr, "--detach and --parent %d cannot be combined: --detach watches no process", parent)
	}
	r, ok := lf.request(o, rest[0], stderr)
	if !ok {
		return exitUsage
	}
	m, ok := mf.start(o, r, lf.url, stderr)
	if !ok {
		return exitUsage
	}
	r.observer = m.observer()
	// The parent is the one dlock hold had when it started: watched from
	// the start, so that a parent gone while the lock is awaited ends the
	// wait, and one gone before dlock hold could look refuses the hold.
	var parentGone <-chan struct{}
	switch {
	case parent != 0:
		gone, stop, err := watchPID(parent)
		if err != nil {
			return o.UsageError(stderr, "not holding %q: --parent %d: %v", r.key, parent, err)
		}
		defer stop()
		parentGone = gone
		r.gone, r.goneWhy = gone, fmt.Sprintf("process %d (--parent) exited", parent)
	case !detach:
		if why := parentGoneAtStart(); why != "" {
			return o.UsageError(stderr, "not holding %q: %s; use --parent PID to watch the process that should keep it (a script run as pid 1: --parent $$), or --detach to hold it until a signal", r.key, why)
		}
		gone, stop := watchParent()
		defer stop()
		parentGone = gone
		r.gone, r.goneWhy = gone, "the process that started dlock hold exited"
	}
	h, code := takeLock(&lf, r, []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}, stderr)
	if h == nil {
		return m.exit(code, nil)
	}
	defer h.close()
	defer func() { code = m.exit(code, h.lk) }() // after the release
	lk := h.lk
	holdCap := newHoldCap(lk, lf.maxHold)
	// A reader gone (stdout closed) does not end the hold: the lock is
	// held until a signal, or the parent's end, says otherwise.
	_, _ = fmt.Fprintf(stdout, "%d %s\n", lk.Token(), lk.Owner())
	var sig os.Signal
	select {
	case sig = <-h.sigc:
	case <-parentGone:
	case <-lk.Lost():
		if holdCap.reached(lk) {
			// The lease ends at the cap; release it now rather than
			// leave it to run out.
			releaseNow("dlock hold", lk, h.stderr)
			fmt.Fprintf(h.stderr, "dlock hold: --max-hold %s reached: released %q\n", lf.maxHold, r.key)
			return exitMaxHold
		}
		fmt.Fprintf(h.stderr, "dlock hold: LOCK LOST: %s\n", errText(lk.Err()))
		return exitLost
	}
	why := fmt.Sprint(sig)
	switch {
	case sig == nil && parent != 0:
		why = fmt.Sprintf("the exit of process %d (--parent)", parent)
	case sig == nil:
		why = "the exit of the process that started dlock hold"
	}
	ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
	defer cancel()
	switch err := lk.Release(ctx); {
	case errors.Is(err, dlock.ErrLockLost):
		fmt.Fprintf(h.stderr, "dlock hold: LOCK LOST before %s came: %s\n", why, errText(err))
		return exitLost
	case err != nil:
		fmt.Fprintf(h.stderr, "dlock hold: on %s: release %q: %v\n", why, r.key, err)
		return exitBackend
	}
	if lf.verbose {
		fmt.Fprintf(h.stderr, "dlock hold: released %q on %s\n", r.key, why)
	}
	return 0
}

// holdCap is --max-hold for a lock taken: the local deadline beyond which
// no renewal extends it.
type holdCap struct {
	max time.Duration // 0: no cap
	end time.Time
}

// newHoldCap reads the cap's deadline off lk, just acquired: its deadline
// is then the acquisition's start + TTL - drift, or already the cap's
// (start + max - drift) if that comes first.
func newHoldCap(lk *dlock.Lock, max time.Duration) holdCap {
	c := holdCap{max: max}
	if max > 0 {
		c.end = lk.Deadline()
		if max > lk.TTL() {
			c.end = c.end.Add(max - lk.TTL())
		}
	}
	return c
}

// reached says whether lk, no longer held, ended at the cap: the library
// says so, or its last deadline was the cap's (dlock run's supervisor
// ends the tree, and dlock releases, before the library's own timer). A
// lease the server no longer had (broken, deleted, taken) is a loss,
// never the cap, however close to it.
func (c holdCap) reached(lk *dlock.Lock) bool {
	if c.max <= 0 {
		return false
	}
	err := lk.Err()
	switch {
	case errors.Is(err, dlock.ErrHoldCapReached):
		return true
	case errors.Is(err, dlock.ErrNotHeld):
		return false
	}
	return !lk.Deadline().Before(c.end)
}
