package main

// The process tree of `dlock run`
//
// A lock must not be released, and must not be lost, while anything
// started under it still runs. CMD may be a shell script, make or a
// pipeline: killing CMD's pid alone leaves its children running. So:
//
//	dlock run (holds and renews the lock)
//	  └─ dlock __supervise   (a re-exec of /proc/self/exe; child subreaper;
//	       │                  its own process group)
//	       └─ CMD            (its own process group; Pdeathsig SIGKILL)
//	            └─ ...       (children, grandchildren, setsid'd daemons)
//
//   - The supervisor is a child subreaper (prctl PR_SET_CHILD_SUBREAPER):
//     any process of the tree whose parent dies is re-parented to it, not to
//     init, so every descendant stays findable through /proc parent links,
//     even one that left CMD's process group or session (setsid, a
//     double-forking daemon). The tree is empty exactly when the supervisor
//     has no children left (wait4 says ECHILD).
//   - dlock and the supervisor talk over two inherited pipes (fd 3: dlock's
//     commands, fd 4: the supervisor's reports; close-on-exec in the
//     supervisor, so CMD has neither). When fd 3 reaches EOF, because dlock
//     died (even by SIGKILL) or closed it on purpose, the supervisor
//     SIGKILLs CMD's group and every descendant, again and again until none
//     is left (bounded), then exits.
//   - Signals: dlock forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to CMD's
//     process group (through the supervisor, which knows when the group id
//     is still CMD's). When dlock is the foreground job of its controlling
//     terminal, CMD's group is made the foreground group (SysProcAttr
//     Foreground), so the keys the terminal turns into signals (Ctrl-C,
//     Ctrl-\) reach CMD's group once, and dlock, in the background, sees
//     none to forward again. The supervisor takes the terminal back (with
//     SIGTTOU ignored) when CMD exits or stops (Ctrl-Z: dlock then stops
//     itself, so the shell sees the job stop; on SIGCONT dlock gives the
//     terminal back to CMD if it is in the foreground and continues CMD).
//     Without a terminal CMD's group simply runs in the background.
//   - Lock lost: SIGTERM (then SIGCONT) to every process of the tree,
//     once, SIGKILL to the whole tree after the term grace, exit 4.
//   - The kill point: the tree must be dead before the server-side lease
//     can pass to anyone else. The local deadline already sits before the
//     server's expiry (the drift allowance); the whole tree is SIGKILLed
//     a kill margin before that deadline (TTL/10, at most 1s: room for
//     the supervisor's timer to fire late on a loaded machine, for the
//     sweep of SIGKILLs and for the kernel to tear the processes down,
//     at a tenth of the lease at most). SIGTERM goes out the term grace
//     before the kill point: --grace, shortened so that SIGTERM never
//     goes out more than TTL/3 before the deadline, that is before a
//     whole renewal interval has passed without a renewal. Once SIGTERM
//     has gone out for a lease running short, the tree is killed at the
//     kill point even if a late renewal still comes through: CMD has been
//     told to stop. --grace in full is for what CMD leaves running when
//     it exits while the lock is still held.
//   - Hung is not dead: dlock stopped (SIGSTOP, SIGTSTP without a
//     terminal) or stalled renews nothing, yet its pipe stays open. So the
//     supervisor enforces the lease itself: dlock passes it the lease
//     deadline at start (--lease-deadline) and again whenever a renewal
//     moves it ("lease N" on fd 3), as a point in time on a clock shared
//     by all processes (leaseClock: CLOCK_BOOTTIME), so a message read
//     late cannot stretch it. When the deadline passes without a newer
//     one, the supervisor acts on its own on the schedule above, without
//     waiting for dlock: at the term point SIGTERM to the tree and it
//     reports "expired", at the kill point SIGKILL. The schedule is the
//     same whether dlock is stopped or its renewals fail (a partition, a
//     hung server): the supervisor cannot tell the two apart, and says
//     only what it knows, that no newer deadline came. The supervisor has a process
//     group of its own, so that stopping dlock's job (kill -STOP %1, or
//     SIGTSTP to the group) does not stop the supervisor too; it ignores
//     SIGTTOU, so that writing to the terminal from the background cannot
//     stop it either.
//   - CMD exits: whatever it left running (`sleep 100 &`) gets SIGTERM, and
//     SIGKILL after --grace, before the lock is released: like systemd's
//     KillMode=control-group. dlock exits with CMD's status.
//   - CMD cannot be started: the supervisor reports "noexec" with the
//     status dlock exits with: 127 if CMD was not found, 126 if it exists
//     but cannot be executed (no execute permission, a directory, not an
//     executable format).
//   - The supervisor itself SIGKILLed (OOM killer), at any point, also
//     while it waits out --grace for CMD's leftovers: CMD gets SIGKILL from
//     its parent-death signal; dlock is a subreaper too, so the orphans come
//     to it. Whenever the supervisor has exited, dlock kills whatever came
//     to it, and says so, before releasing the lock; what it cannot kill
//     keeps the lock unreleased (the lease runs out). If dlock and the
//     supervisor both die, Pdeathsig is all that is left: CMD dies, its
//     descendants may not.
//   - Not covered: a process that escapes the tree by asking another
//     service to run it (systemd-run, ssh, at, a daemon's job queue).

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlock-go/dlock"
)

// superviseCmd is the hidden subcommand run as the supervisor.
const superviseCmd = "__supervise"

// The supervisor's inherited pipe ends.
const (
	ctlFD    = 3 // dlock → supervisor: commands; EOF means kill everything
	statusFD = 4 // supervisor → dlock: reports
)

// Maximum sweeps and time spent killing a tree that will not die (processes
// stuck in the kernel).
const (
	killSweeps  = 500
	killTimeout = 10 * time.Second
)

// reapEvent is one wait4 result; empty means no children are left.
type reapEvent struct {
	pid   int
	ws    syscall.WaitStatus
	empty bool
}

type supervisor struct {
	self  int
	pid   int           // CMD's pid, also its process group id
	alive bool          // CMD not reaped yet: its pid (so its group id) cannot be reused
	tty   int           // the controlling terminal when CMD has its foreground, else -1
	job   int           // dlock's process group, the job the terminal belongs to
	grace time.Duration // SIGTERM to SIGKILL for what CMD leaves running
	// margin and termGrace place the kill point and the term point
	// before leaseEnd (see the top of this file).
	margin    time.Duration
	termGrace time.Duration
	// leaseEnd is the lease deadline on leaseClock (0: not enforced);
	// expired is set once it passed.
	leaseEnd int64
	expired  bool
	status   *os.File
	reaped   chan reapEvent
	stderr   io.Writer
	// reported is set once CMD's status went to dlock.
	reported bool
}

func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && uint32(st.Mode)&syscall.S_IFMT == syscall.S_IFIFO
}

// cmdSupervise is `dlock __supervise --pgrp N [--grace D] [--kill-margin D]
// [--term-grace D] [--lease-deadline N] -- CMD [ARGS...]`, started by dlock
// run only.
func cmdSupervise(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(superviseCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	grace := fs.Duration("grace", 5*time.Second, "time between SIGTERM and SIGKILL for leftovers")
	pgrp := fs.Int("pgrp", 0, "dlock's process group, which gets the terminal back from CMD")
	margin := fs.Duration("kill-margin", 0, "how long before the lease deadline the tree is SIGKILLed")
	termGrace := fs.Duration("term-grace", 0, "time between SIGTERM and SIGKILL when the lease runs short or is lost")
	lease := fs.Int64("lease-deadline", 0, "the lease deadline on leaseClock, in ns (0: not enforced)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 || *grace < 0 || *margin < 0 || *termGrace < 0 || *lease < 0 || *pgrp <= 0 || !isPipe(ctlFD) || !isPipe(statusFD) {
		fmt.Fprintf(stderr, "dlock: %s is internal to dlock run\n", superviseCmd)
		return exitUsage
	}
	syscall.CloseOnExec(ctlFD)
	syscall.CloseOnExec(statusFD)
	ctl, err := newCtlPipe(ctlFD)
	if err != nil {
		fmt.Fprintf(stderr, "dlock: %s: control pipe: %v\n", superviseCmd, err)
		return exitUsage
	}
	s := &supervisor{
		self:      os.Getpid(),
		tty:       -1,
		grace:     *grace,
		margin:    *margin,
		termGrace: *termGrace,
		leaseEnd:  *lease,
		job:       *pgrp,
		status:    os.NewFile(statusFD, "dlock-status"),
		reaped:    make(chan reapEvent, 64),
		stderr:    stderr,
	}
	return s.run(fs.Args(), ctl)
}

// ctlPipe is the supervisor's end of fd 3, read by its run loop alone, so
// that the loop can read everything dlock wrote before it decides
// anything (see the lease check). A goroutine only watches for input.
type ctlPipe struct {
	fd      int
	partial []byte        // the start of a line not yet complete
	ready   chan struct{} // there is input, or EOF
	resume  chan struct{} // the run loop has read it: watch again
}

// maxCommand bounds a line from dlock (dlock's are a few bytes); a read
// of fd 3 takes at most maxReads reads.
const (
	maxCommand = 4096
	maxReads   = 1024
)

func newCtlPipe(fd int) (*ctlPipe, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	return &ctlPipe{fd: fd, ready: make(chan struct{}), resume: make(chan struct{})}, nil
}

// watch signals ready whenever fd 3 has input (or EOF, or an error, which
// read then reports), and waits for the run loop to have read it.
func (c *ctlPipe) watch() {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); errors.Is(err, syscall.EINTR) {
			continue
		}
		c.ready <- struct{}{}
		<-c.resume
	}
}

// unread puts lines back, to be returned again by the next read.
func (c *ctlPipe) unread(lines []string) {
	var b []byte
	for _, l := range lines {
		b = append(append(b, l...), '\n')
	}
	c.partial = append(b, c.partial...)
}

// read returns the complete lines dlock has written so far, without
// waiting; open is false once the pipe is at EOF (or broken).
func (c *ctlPipe) read() (lines []string, open bool) {
	var buf [512]byte
	open = true
	for range maxReads { // a pipe holds 64 KiB at most: a few reads drain it
		n, err := syscall.Read(c.fd, buf[:])
		if n > 0 {
			c.partial = append(c.partial, buf[:n]...)
			continue
		}
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		open = errors.Is(err, syscall.EAGAIN) // else EOF (0, nil) or broken
		break
	}
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		lines = append(lines, string(c.partial[:i]))
		c.partial = c.partial[i+1:]
	}
	if len(c.partial) > maxCommand {
		c.partial = nil // not dlock's
	}
	return lines, open
}

func (s *supervisor) report(format string, args ...any) {
	line := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " ")
	_, _ = io.WriteString(s.status, line+"\n")
}

func (s *supervisor) run(argv []string, ctl *ctlPipe) int {
	// CMD's parent-death signal fires when the thread that forked it
	// exits: fork from a thread that lives as long as the process.
	runtime.LockOSThread()
	_ = setSubreaper() // outside Linux orphans go to init: nothing to do
	// Catch (not ignore: CMD would inherit that) what dlock forwards, so
	// that a stray one cannot end the supervisor (it is not in dlock's
	// group, so signals to dlock's job do not reach it anyway); and
	// SIGPIPE, so a closed stderr cannot kill it mid-cleanup.
	// Signals dlock was started with ignored (nohup, "&" in a script) stay
	// ignored, for CMD to inherit as before.
	catch(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	openStdio()
	// dlock gone already, or a supervisor that took longer to start than
	// the lease lasts (a stalled machine): CMD must not start at all.
	lines, open := ctl.read()
	for _, c := range lines {
		if verb, arg, _ := strings.Cut(c, " "); verb == "lease" {
			if n, err := strconv.ParseInt(arg, 10, 64); err == nil && n > 0 {
				s.leaseEnd = n
			}
		}
	}
	ctl.unread(lines) // for the run loop, once CMD runs
	if !open {
		return 0
	}
	if s.leaseEnd != 0 && leaseClock() >= s.killPoint() {
		s.expired = true
		s.report("expired")
		return 0
	}
	s.tty = foregroundTTY(s.job)
	pid, err := startCmd(argv, s.tty)
	if err != nil && s.tty >= 0 {
		// Perhaps the terminal could not be handed over (fork failed
		// before exec, so nothing ran): run CMD in the background.
		syscall.Close(s.tty)
		s.tty = -1
		pid, err = startCmd(argv, s.tty)
	}
	if err != nil {
		code := execFailureStatus(err)
		s.report("noexec %d %v", code, err)
		return code
	}
	s.pid, s.alive = pid, true
	// In a background group of its own, the supervisor takes the terminal
	// back for dlock and writes messages to it: SIGTTOU must not stop it.
	// Only now: CMD must not inherit the ignored signal.
	signal.Ignore(syscall.SIGTTOU)
	s.report("pid %d", pid)
	go s.reap()
	go ctl.watch()

	var cleanup <-chan time.Time
	termSent := false // the tree had its SIGTERM: it gets no other
	leaseCheck := time.NewTimer(s.untilLeaseCheck())
	defer leaseCheck.Stop()
	// readCommands runs what dlock has written so far; false means fd 3
	// reached EOF: dlock is gone or wants everything killed.
	readCommands := func() bool {
		lines, open := ctl.read()
		for _, c := range lines {
			switch verb, arg, _ := strings.Cut(c, " "); verb {
			case "lease":
				if n, err := strconv.ParseInt(arg, 10, 64); err == nil && n > 0 && !s.expired {
					s.leaseEnd = n
					leaseCheck.Reset(s.untilLeaseCheck())
				}
			case "term":
				// dlock saw the lock lost; it sends SIGKILL itself after
				// the term grace, by closing fd 3, and the kill point
				// holds anyway.
				if !termSent {
					termSent = true
					s.signalTree(syscall.SIGTERM)
				}
			case "cont":
				if !termSent { // a tree being terminated was continued already
					s.command(c)
				}
			default:
				s.command(c)
			}
		}
		return open
	}
	if !readCommands() { // what came before CMD started
		return s.killAll()
	}
	for {
		select {
		case <-ctl.ready:
			if !readCommands() {
				return s.killAll()
			}
			ctl.resume <- struct{}{}
		case <-leaseCheck.C:
			if s.leaseEnd == 0 {
				continue
			}
			// A newer deadline may wait in the pipe, unread: the
			// supervisor itself may have been stopped while dlock renewed.
			if !readCommands() {
				return s.killAll()
			}
			if left := s.untilLeaseCheck(); left > 0 {
				leaseCheck.Reset(left)
				continue
			}
			if s.expired { // the kill point
				if left := descendants(s.self); len(left) > 0 {
					fmt.Fprintf(s.stderr, "dlock run: pid %s still running %s before the lease deadline; sending SIGKILL\n", pidList(left), s.margin)
				}
				return s.killAll()
			}
			// The term point, with no newer deadline: SIGTERM first,
			// then the words.
			s.expired = true
			told := termSent
			if !termSent {
				termSent = true
				s.signalTree(syscall.SIGTERM)
			}
			s.report("expired")
			killIn := max(0, time.Duration(s.killPoint()-leaseClock()))
			leaseCheck.Reset(s.untilLeaseCheck())
			if !told {
				fmt.Fprintf(s.stderr, "dlock run: the lease was not renewed in time (no newer deadline came from dlock, pid %d); sent SIGTERM to CMD's process tree (SIGKILL in %s, %s before the lease deadline)\n", os.Getppid(), killIn.Round(time.Millisecond), s.margin)
			}
		case ev := <-s.reaped:
			if ev.empty {
				return 0 // CMD was our child, so it has been reaped: all done
			}
			if ev.pid != s.pid || !s.cmdEvent(ev.ws) {
				continue
			}
			// CMD is gone. Anything it left behind goes too, before dlock
			// releases the lock.
			if cleanup == nil {
				cleanup = time.After(s.grace)
			}
			if left := descendants(s.self); len(left) > 0 {
				if !termSent {
					termSent = true
					fmt.Fprintf(s.stderr, "dlock run: CMD exited; %d of its processes still run (pid %s); sending SIGTERM (SIGKILL in %s)\n", len(left), pidList(left), s.grace)
					s.signalTree(syscall.SIGTERM)
				}
			}
		case <-cleanup:
			left := descendants(s.self)
			if len(left) > 0 {
				fmt.Fprintf(s.stderr, "dlock run: pid %s still running after %s; sending SIGKILL\n", pidList(left), s.grace)
			}
			return s.killAll()
		}
	}
}

// leaseCheckEvery bounds the wait between two looks at leaseClock: Go's
// timers do not count time suspended, the lease does.
const leaseCheckEvery = time.Second

// killPoint is when, on leaseClock, the whole tree is SIGKILLed: the
// kill margin before the lease deadline.
func (s *supervisor) killPoint() int64 { return s.leaseEnd - int64(s.margin) }

// termPoint is when the tree gets SIGTERM: the term grace before the
// kill point.
func (s *supervisor) termPoint() int64 { return s.killPoint() - int64(s.termGrace) }

// untilLeaseCheck is how long to wait before looking at the lease again:
// until the term point (the kill point once expired), at most
// leaseCheckEvery; 0 once it has passed.
func (s *supervisor) untilLeaseCheck() time.Duration {
	if s.leaseEnd == 0 {
		return leaseCheckEvery
	}
	next := s.termPoint()
	if s.expired {
		next = s.killPoint()
	}
	left := time.Duration(next - leaseClock())
	return max(0, min(left, leaseCheckEvery))
}

// catch is signal.Notify for the signals that are not ignored: Notify
// would un-ignore them, for CMD too.
func catch(c chan<- os.Signal, sigs ...os.Signal) {
	var keep []os.Signal
	for _, s := range sigs {
		if !signal.Ignored(s) {
			keep = append(keep, s)
		}
	}
	if len(keep) > 0 { // Notify with no signal means every signal
		signal.Notify(c, keep...)
	}
}

func pidList(pids []int) string {
	var b strings.Builder
	for i, p := range pids {
		if i == 8 {
			fmt.Fprintf(&b, ", ... (%d more)", len(pids)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}

// openStdio makes sure fds 0-2 exist, so that CMD can be given them.
func openStdio() {
	for fd := 0; fd <= 2; fd++ {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			continue
		}
		if nfd, err := syscall.Open(os.DevNull, syscall.O_RDWR, 0); err == nil && nfd != fd {
			_ = syscall.Dup2(nfd, fd)
			syscall.Close(nfd)
		}
	}
}

// startCmd starts CMD in its own process group.
func startCmd(argv []string, tty int) (int, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, err
	}
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}, Sys: cmdSysProcAttr(tty)}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", argv[0], err)
	}
	return pid, nil
}

// execFailureStatus is the exit status for CMD that could not be started,
// as the shells have it: 127 if it was not found, 126 if it was found but
// could not be executed (permission, a directory, an unknown format).
func execFailureStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return exitNoExec
	}
	return exitCannotExec
}

// reap waits for every child (CMD and re-parented orphans) and reports
// each; ECHILD means the tree is empty.
func (s *supervisor) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WUNTRACED, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			s.reaped <- reapEvent{empty: true}
			return
		}
		s.reaped <- reapEvent{pid: pid, ws: ws}
	}
}

// cmdEvent handles a wait status of CMD; true means CMD has ended.
func (s *supervisor) cmdEvent(ws syscall.WaitStatus) bool {
	if ws.Stopped() {
		// Ctrl-Z, or terminal input after "bg": the job is stopped.
		if s.tty >= 0 && s.alive {
			s.takeTerminal()
			s.report("stop")
		}
		return false
	}
	s.alive = false
	if s.tty >= 0 {
		s.takeTerminal()
	}
	if !s.reported {
		s.reported = true
		s.report("exit %d", waitStatusCode(ws))
	}
	return true
}

// waitStatusCode is a shell-style status: the exit code, or 128+signal.
func waitStatusCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// takeTerminal gives the terminal back to dlock's group if CMD's group
// has it (after "bg" the shell has it, and keeps it).
func (s *supervisor) takeTerminal() {
	if pg, err := tcgetpgrp(s.tty); err == nil && pg == s.pid {
		_ = tcsetpgrp(s.tty, s.job)
	}
}

// command runs one of dlock's commands "sig N" and "cont" ("lease" and
// "term" are the run loop's).
func (s *supervisor) command(c string) {
	verb, arg, _ := strings.Cut(c, " ")
	switch verb {
	case "sig":
		if n, err := strconv.Atoi(arg); err == nil && s.alive && n > 0 && n < 65 {
			_ = syscall.Kill(-s.pid, syscall.Signal(n))
		}
	case "cont":
		if !s.alive {
			return
		}
		if s.tty >= 0 {
			if pg, err := tcgetpgrp(s.tty); err == nil && pg == s.job {
				_ = tcsetpgrp(s.tty, s.pid)
			}
		}
		_ = syscall.Kill(-s.pid, syscall.SIGCONT)
	}
}

// signalTree sends sig, then SIGCONT (a stopped process acts on SIGTERM
// only once continued), to CMD's group and every descendant, once each: a
// process in CMD's group gets the group's signal only, or a shell's trap
// would run twice.
func (s *supervisor) signalTree(sig syscall.Signal) {
	var others []int
	for _, p := range descendants(s.self) {
		if pg, err := syscall.Getpgid(p); !s.alive || err != nil || pg != s.pid {
			others = append(others, p)
		}
	}
	for _, sg := range []syscall.Signal{sig, syscall.SIGCONT} {
		if s.alive {
			_ = syscall.Kill(-s.pid, sg)
		}
		for _, p := range others {
			_ = syscall.Kill(p, sg)
		}
	}
}

// killAll SIGKILLs the whole tree until nothing is left below the
// supervisor, then returns its exit status.
func (s *supervisor) killAll() int {
	deadline := time.Now().Add(killTimeout)
	for sweep := 0; ; sweep++ {
		if s.alive {
			_ = syscall.Kill(-s.pid, syscall.SIGKILL)
		}
		for _, p := range descendants(s.self) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		t := time.NewTimer(20 * time.Millisecond)
	drain:
		for {
			select {
			case ev := <-s.reaped:
				if ev.empty {
					t.Stop()
					return 0
				}
				if ev.pid == s.pid && !ev.ws.Stopped() {
					s.cmdEvent(ev.ws)
				}
			case <-t.C:
				break drain
			}
		}
		if sweep >= killSweeps || time.Now().After(deadline) {
			fmt.Fprintf(s.stderr, "dlock run: could not kill pid %s\n", pidList(descendants(s.self)))
			return 1
		}
	}
}

// supHandle is dlock run's side of its supervisor.
type supHandle struct {
	cmd    *exec.Cmd
	ctl    *os.File
	events chan supEvent
}

// supEvent is one report of the supervisor; kind "done" comes last, once
// the supervisor has exited (err is its Wait error).
type supEvent struct {
	kind string // pid, noexec (n: 126 or 127), exit, stop, done
	n    int
	msg  string
	err  error
}

// startSupervisor starts `dlock __supervise` for cmdArgs with env; it
// enforces leaseEnd (on leaseClock), with the schedule of k, until told a
// later one.
func startSupervisor(cmdArgs, env []string, k killSchedule, leaseEnd int64) (*supHandle, error) {
	exe := "/proc/self/exe"
	if runtime.GOOS != "linux" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	stR, stW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	c := &exec.Cmd{
		Path: exe,
		Args: append([]string{"dlock", superviseCmd, "--pgrp", strconv.Itoa(syscall.Getpgrp()),
			"--grace", k.grace.String(), "--kill-margin", k.margin.String(), "--term-grace", k.termGrace.String(), "--lease-deadline", strconv.FormatInt(leaseEnd, 10), "--"}, cmdArgs...),
		Env:        env,
		Stdin:      os.Stdin,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		ExtraFiles: []*os.File{ctlR, stW},
		// Not in dlock's job: stopping the job must not stop the
		// supervisor, which enforces the lease then.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = c.Start()
	ctlR.Close()
	stW.Close()
	if err != nil {
		ctlW.Close()
		stR.Close()
		return nil, err
	}
	h := &supHandle{cmd: c, ctl: ctlW, events: make(chan supEvent, 8)}
	go func() {
		sc := bufio.NewScanner(stR)
		for sc.Scan() {
			kind, arg, _ := strings.Cut(sc.Text(), " ")
			if kind == "noexec" { // noexec STATUS MESSAGE
				code, msg, _ := strings.Cut(arg, " ")
				n, err := strconv.Atoi(code)
				if err != nil {
					n = exitNoExec
				}
				h.events <- supEvent{kind: kind, n: n, msg: msg}
				continue
			}
			n, _ := strconv.Atoi(arg)
			h.events <- supEvent{kind: kind, n: n, msg: arg}
		}
		stR.Close()
		h.events <- supEvent{kind: "done", err: c.Wait()}
	}()
	return h, nil
}

// send writes one command; errors mean the supervisor is gone, which its
// "done" event reports.
func (h *supHandle) send(format string, args ...any) {
	if h.ctl != nil {
		_, _ = fmt.Fprintf(h.ctl, format+"\n", args...)
	}
}

// leaseDeadline is lk's local deadline as a point on leaseClock. The
// clock is read first: were dlock stopped between the two readings, the
// result would come out earlier, never later, than the real deadline.
func leaseDeadline(lk *dlock.Lock) int64 {
	now := leaseClock()
	return now + max(0, int64(time.Until(lk.Deadline())))
}

// killTree closes the control pipe: the supervisor SIGKILLs the tree.
func (h *supHandle) killTree() {
	if h.ctl != nil {
		h.ctl.Close()
		h.ctl = nil
	}
}

// sweepOrphans kills and reaps whatever was re-parented to dlock after its
// supervisor exited (dlock is a subreaper too): nothing, unless the
// supervisor died before it was done. It returns the pids it killed and
// those still alive when it gave up (bounded like killAll).
func sweepOrphans() (killed, left []int) {
	self := os.Getpid()
	seen := make(map[int]bool)
	deadline := time.Now().Add(killTimeout)
	for sweep := 0; ; sweep++ {
		for _, p := range descendants(self) {
			if syscall.Kill(p, syscall.SIGKILL) == nil && !seen[p] {
				seen[p] = true
				killed = append(killed, p)
			}
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.ECHILD) {
				return killed, nil
			}
			if pid <= 0 || err != nil {
				break
			}
		}
		if sweep >= killSweeps || time.Now().After(deadline) {
			return killed, descendants(self)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killSchedule is how dlock run ends CMD's tree: when the lock is lost or
// its lease runs short, SIGTERM termGrace before the kill point, which is
// margin before the lease deadline; grace is --grace, SIGTERM to SIGKILL
// for what CMD leaves running when it exits.
type killSchedule struct {
	grace, margin, termGrace time.Duration
}

// newKillSchedule places the kill point and the term point for a lease of
// ttl: the margin is ttl/10, at most 1s; the term grace is grace, at most
// ttl/3 less the margin, so that SIGTERM never goes out before a whole
// renewal interval (ttl/3) has passed without a renewal. clamped reports
// a grace shortened.
func newKillSchedule(ttl, grace time.Duration) (k killSchedule, clamped bool) {
	k = killSchedule{grace: grace, margin: min(ttl/10, time.Second), termGrace: grace}
	if most := max(0, ttl/3-k.margin); k.termGrace > most {
		k.termGrace, clamped = most, true
	}
	return k, clamped
}
