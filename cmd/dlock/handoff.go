package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
)

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
