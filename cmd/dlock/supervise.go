package main

// The process tree of `dlock run`
//
// A lock must not be released, and must not be lost, while anything
// started under it still runs. CMD may be a shell script, make or a
// pipeline: killing CMD's pid alone leaves its children running. So:
//
//	dlock run (holds and renews the lock)
//	  └─ dlock __supervise   (a re-exec of /proc/self/exe; child subreaper)
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
//     SIGKILL to the whole tree after --grace, exit 4.
//   - CMD exits: whatever it left running (`sleep 100 &`) gets SIGTERM, and
//     SIGKILL after --grace, before the lock is released: like systemd's
//     KillMode=control-group. dlock exits with CMD's status.
//   - CMD cannot be started: the supervisor reports "noexec" and dlock
//     exits 127.
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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	self   int
	pid    int  // CMD's pid, also its process group id
	alive  bool // CMD not reaped yet: its pid (so its group id) cannot be reused
	tty    int  // the controlling terminal when CMD has its foreground, else -1
	grace  time.Duration
	status *os.File
	reaped chan reapEvent
	stderr io.Writer
	// reported is set once CMD's status went to dlock.
	reported bool
}

func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && uint32(st.Mode)&syscall.S_IFMT == syscall.S_IFIFO
}

// cmdSupervise is `dlock __supervise [--grace D] -- CMD [ARGS...]`, started
// by dlock run only.
func cmdSupervise(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(superviseCmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	grace := fs.Duration("grace", 5*time.Second, "time between SIGTERM and SIGKILL for leftovers")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 || *grace < 0 || !isPipe(ctlFD) || !isPipe(statusFD) {
		fmt.Fprintf(stderr, "dlock: %s is internal to dlock run\n", superviseCmd)
		return exitUsage
	}
	syscall.CloseOnExec(ctlFD)
	syscall.CloseOnExec(statusFD)
	s := &supervisor{
		self:   os.Getpid(),
		tty:    -1,
		grace:  *grace,
		status: os.NewFile(statusFD, "dlock-status"),
		reaped: make(chan reapEvent, 64),
		stderr: stderr,
	}
	return s.run(fs.Args(), os.NewFile(ctlFD, "dlock-control"))
}

func (s *supervisor) report(format string, args ...any) {
	line := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " ")
	_, _ = io.WriteString(s.status, line+"\n")
}

func (s *supervisor) run(argv []string, ctl *os.File) int {
	// CMD's parent-death signal fires when the thread that forked it
	// exits: fork from a thread that lives as long as the process.
	runtime.LockOSThread()
	_ = setSubreaper() // outside Linux orphans go to init: nothing to do
	// Catch (not ignore: CMD would inherit that) what dlock forwards, so
	// that the supervisor survives a signal sent to dlock's whole group;
	// and SIGPIPE, so a closed stderr cannot kill it mid-cleanup.
	// Signals dlock was started with ignored (nohup, "&" in a script) stay
	// ignored, for CMD to inherit as before.
	catch(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	openStdio()
	s.tty = foregroundTTY()
	pid, err := startCmd(argv, s.tty)
	if err != nil && s.tty >= 0 {
		// Perhaps the terminal could not be handed over (fork failed
		// before exec, so nothing ran): run CMD in the background.
		syscall.Close(s.tty)
		s.tty = -1
		pid, err = startCmd(argv, s.tty)
	}
	if err != nil {
		s.report("noexec %v", err)
		return exitNoExec
	}
	s.pid, s.alive = pid, true
	if s.tty >= 0 {
		signal.Ignore(syscall.SIGTTOU) // to take the terminal back from the background
	}
	s.report("pid %d", pid)
	go s.reap()
	cmds := make(chan string, 16)
	go func() {
		defer close(cmds)
		sc := bufio.NewScanner(ctl)
		for sc.Scan() {
			cmds <- sc.Text()
		}
	}()

	var cleanup <-chan time.Time
	termSent := false
	for {
		select {
		case c, ok := <-cmds:
			if !ok {
				return s.killAll()
			}
			if c == "term" {
				termSent = true
			}
			s.command(c)
		case ev := <-s.reaped:
			if ev.empty {
				return 0 // CMD was our child, so it has been reaped: all done
			}
			if ev.pid != s.pid || !s.cmdEvent(ev.ws) {
				continue
			}
			// CMD is gone. Anything it left behind goes too, before dlock
			// releases the lock.
			cleanup = time.After(s.grace)
			if left := descendants(s.self); len(left) > 0 {
				if !termSent {
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
		_ = tcsetpgrp(s.tty, syscall.Getpgrp())
	}
}

// command runs one of dlock's commands.
func (s *supervisor) command(c string) {
	verb, arg, _ := strings.Cut(c, " ")
	switch verb {
	case "sig":
		if n, err := strconv.Atoi(arg); err == nil && s.alive && n > 0 && n < 65 {
			_ = syscall.Kill(-s.pid, syscall.Signal(n))
		}
	case "term":
		s.signalTree(syscall.SIGTERM)
	case "cont":
		if !s.alive {
			return
		}
		if s.tty >= 0 {
			if pg, err := tcgetpgrp(s.tty); err == nil && pg == syscall.Getpgrp() {
				_ = tcsetpgrp(s.tty, s.pid)
			}
		}
		_ = syscall.Kill(-s.pid, syscall.SIGCONT)
	}
}

// signalTree sends sig, then SIGCONT (a stopped process acts on SIGTERM
// only once continued), to CMD's group and every descendant.
func (s *supervisor) signalTree(sig syscall.Signal) {
	for _, sg := range []syscall.Signal{sig, syscall.SIGCONT} {
		if s.alive {
			_ = syscall.Kill(-s.pid, sg)
		}
		for _, p := range descendants(s.self) {
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
	kind string // pid, noexec, exit, stop, done
	n    int
	msg  string
	err  error
}

// startSupervisor starts `dlock __supervise` for cmdArgs with env.
func startSupervisor(cmdArgs, env []string, grace time.Duration) (*supHandle, error) {
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
		Path:       exe,
		Args:       append([]string{"dlock", superviseCmd, "--grace", grace.String(), "--"}, cmdArgs...),
		Env:        env,
		Stdin:      os.Stdin,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		ExtraFiles: []*os.File{ctlR, stW},
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
