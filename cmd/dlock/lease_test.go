//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// readTicks returns the timestamps (ns since the epoch, from date +%s%N)
// in file, one a line; a partial last line is left out.
func readTicks(t *testing.T, file string) []int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []int64
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	} else {
		s = ""
	}
	for _, l := range strings.Fields(s) {
		n, err := strconv.ParseInt(l, 10, 64)
		if err != nil {
			t.Fatalf("tick %q: %v", l, err)
		}
		out = append(out, n)
	}
	return out
}

// "Hung is not dead": a stopped dlock renews nothing, so its supervisor
// enforces the lease deadline itself. CMD stops before another dlock can
// get the key; continued, the first dlock reports the lock lost (exit 4).
func TestStoppedDlockCannotOutliveLease(t *testing.T) {
	t.Parallel()
	testStoppedCannotOutliveLease(t, false)
}

// The same when the whole job is stopped, as `kill -TSTP %1` does: the
// signal goes to dlock's process group, which the supervisor must not be
// part of.
func TestStoppedJobCannotOutliveLease(t *testing.T) {
	t.Parallel()
	testStoppedCannotOutliveLease(t, true)
}

func testStoppedCannotOutliveLease(t *testing.T, wholeJob bool) {
	url := fileURL(t)
	ticks := filepath.Join(t.TempDir(), "ticks")
	// CMD writes a wall-clock timestamp per tick; so does the second CMD,
	// once it has the lock. Every tick of the first must come before it.
	script := `echo $$ > "$0.pid"; echo started; while :; do date +%s%N >> "$0"; sleep 0.05; done`
	args := []string{"run", "--ttl", "2s", "--grace", "1s", "k", "--", "sh", "-c", script, ticks}
	var (
		holder *exec.Cmd
		errb   *syncBuffer
	)
	if wholeJob {
		// A job of its own, as a shell with job control starts it.
		holder = dlockCmd(context.Background(), url, args...)
		holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		errb = &syncBuffer{}
		holder.Stdout, holder.Stderr = io.Discard, errb
		holder.WaitDelay = 5 * time.Second
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			syscall.Kill(-holder.Process.Pid, syscall.SIGCONT)
			stopCmd(t, holder)
		})
	} else {
		holder, errb, _ = background(t, url, args...)
	}
	pid := holder.Process.Pid
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	waitFor(t, hang, "CMD never ticked", func() bool { return len(readTicks(t, ticks)) > 0 })
	target, sig := pid, syscall.SIGSTOP
	if wholeJob {
		target, sig = -pid, syscall.SIGTSTP
	}
	stopBetweenRecordUpdates(t, pid, target, sig)

	// Another dlock waits for the key: it gets it once the stopped one's
	// lease has run out.
	second := runDlock(t, url, "run", "-w", hang.String(), "k", "--", "date", "+%s%N")
	if second.code != 0 {
		t.Fatalf("second dlock: exit %d %q", second.code, second.stderr)
	}
	acquired, err := strconv.ParseInt(strings.TrimSpace(second.stdout), 10, 64)
	if err != nil {
		t.Fatalf("second CMD printed %q", second.stdout)
	}
	// The first CMD must be gone by then; once it is, it ticks no more.
	pidB, err := os.ReadFile(ticks + ".pid")
	if err != nil {
		t.Fatal(err)
	}
	cmdPid, err := strconv.Atoi(strings.TrimSpace(string(pidB)))
	if err != nil {
		t.Fatalf("CMD's pid file: %q", pidB)
	}
	waitFor(t, hang, "the first CMD still runs after the second dlock had the key", func() bool { return !alive(cmdPid) })
	all := readTicks(t, ticks)
	if last := all[len(all)-1]; last >= acquired {
		late := 0
		for _, tk := range all {
			if tk >= acquired {
				late++
			}
		}
		t.Errorf("the first CMD ticked %d times after the second dlock had the key (last tick %v after)", late, time.Duration(last-acquired))
	}

	if err := syscall.Kill(target, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != exitLost {
		t.Errorf("continued dlock: exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	if !strings.Contains(errb.String(), "not renewed") {
		t.Errorf("stderr does not say the lease ran out: %s", errb.String())
	}
}

// stopBetweenRecordUpdates stops dlock (pid) by sending sig to target,
// at a moment it holds none of the file backend's record flocks. Stopped
// inside a record update, it would keep every process off the key until
// it continues (a limit filelock documents); the test is about a holder
// stopped between its renewals, so such a stop is continued and made
// again.
func stopBetweenRecordUpdates(t *testing.T, pid, target int, sig syscall.Signal) {
	t.Helper()
	for try := 1; ; try++ {
		if err := syscall.Kill(target, sig); err != nil {
			t.Fatal(err)
		}
		waitFor(t, hang, "dlock did not stop", func() bool { return procState(pid) == 'T' })
		if !holdsFlock(t, pid) {
			return
		}
		if try == 20 {
			t.Fatalf("dlock stopped inside a record update %d times in a row", try)
		}
		if err := syscall.Kill(target, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdsFlock reports whether pid holds a flock(2) lock (/proc/locks).
func holdsFlock(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; a waiter's
		// line has "->" after the number.
		f := strings.Fields(line)
		if len(f) >= 5 && f[1] == "FLOCK" && f[4] == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}

// The supervisor stopped for longer than the lease while dlock renews it:
// continued, it reads the newer deadlines dlock sent meanwhile before it
// judges the lease, and does not kill CMD for nothing.
func TestStoppedSupervisorDoesNotKillOnResume(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e "$0" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; echo finished`
	holder, errb, out := background(t, url, "run", "--verbose", "--ttl", "2s", "k", "--", "sh", "-c", script, done)
	var sup int
	re := regexp.MustCompile(`supervisor pid (\d+)`)
	waitFor(t, hang, "no supervisor pid in --verbose output", func() bool {
		if mm := re.FindStringSubmatch(errb.String()); mm != nil {
			sup, _ = strconv.Atoi(mm[1])
		}
		return sup > 0
	})
	if err := syscall.Kill(sup, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(sup, syscall.SIGCONT) })
	time.Sleep(3 * time.Second) // longer than the lease: dlock renews it meanwhile
	if err := syscall.Kill(sup, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // time to act on a stale deadline, were it to
	if err := os.WriteFile(done, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != 0 || !strings.Contains(out.String(), "finished") {
		t.Errorf("exit %d, stdout %q, stderr %s; want CMD to finish", code, out.String(), errb.String())
	}
}

// startSupervise runs `dlock __supervise` as dlock run does, and returns
// it with the write end of its fd 3 and a reader of its fd 4.
func startSupervise(t *testing.T, leaseEnd int64, cmd ...string) (*exec.Cmd, *os.File, *bufio.Scanner) {
	t.Helper()
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stR, stW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{superviseCmd, "--pgrp", strconv.Itoa(syscall.Getpgrp()), "--grace", "100ms",
		"--lease-deadline", strconv.FormatInt(leaseEnd, 10), "--"}, cmd...)
	sup := exec.Command(bin, args...)
	sup.ExtraFiles = []*os.File{ctlR, stW}
	sup.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	ctlR.Close()
	stW.Close()
	t.Cleanup(func() {
		ctlW.Close() // the supervisor kills its tree and exits
		stopCmd(t, sup)
		stR.Close()
	})
	return sup, ctlW, bufio.NewScanner(stR)
}

// The supervisor's side of the lease: a deadline passed before CMD could
// start means CMD never runs; a deadline moved by "lease N" is not
// enforced before N.
func TestSupervisorLeaseProtocol(t *testing.T) {
	t.Parallel()
	const m = "300.951"
	killMarked(t, m)
	out := filepath.Join(t.TempDir(), "ran")
	sup, _, st := startSupervise(t, 1, "sh", "-c", `echo ran > "$0"`, out)
	var reports []string
	for st.Scan() {
		reports = append(reports, st.Text())
	}
	if code := waitExit(t, sup); code != 0 || strings.Join(reports, ";") != "expired" {
		t.Errorf("lease over before start: exit %d, reports %q; want 0 and only expired", code, reports)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("CMD ran although the lease was over before it started")
	}

	first := leaseClock() + int64(time.Second)
	sup, ctl, st := startSupervise(t, first, "sleep", m)
	extended := leaseClock() + int64(2*time.Second)
	if _, err := fmt.Fprintf(ctl, "lease %d\n", extended); err != nil {
		t.Fatal(err)
	}
	// Were the message written after the first deadline, the supervisor
	// would be right to have enforced that one.
	intime := leaseClock() < first
	var got []string
	for st.Scan() && st.Text() != "expired" {
		got = append(got, st.Text())
	}
	if now := leaseClock(); now < extended && intime {
		t.Errorf("the supervisor enforced the first deadline: expired %v before the one it was sent", time.Duration(extended-now))
	}
	if len(got) == 0 || !strings.HasPrefix(got[0], "pid ") {
		t.Errorf("reports before expired: %q, want pid first", got)
	}
	waitExit(t, sup)
	waitGone(t, "CMD after the lease expired", func() []int { return sleeps(m) })
}

// openPidfds opens a pidfd for each pid: whether the process has exited
// can then be asked at any moment, with no risk of pid reuse.
func openPidfds(t *testing.T, pids []int) map[int]int {
	t.Helper()
	fds := make(map[int]int, len(pids))
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	for _, p := range pids {
		fd, err := unix.PidfdOpen(p, 0)
		if err != nil {
			t.Fatalf("pidfd_open %d: %v", p, err)
		}
		fds[p] = fd
	}
	return fds
}

// runningNow returns the pids of fds whose process has not exited (a
// zombie has), looking without waiting.
func runningNow(t *testing.T, fds map[int]int) []int {
	t.Helper()
	var out []int
	for p, fd := range fds {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		var n int
		var err error
		for range 100 {
			if n, err = unix.Poll(pfd, 0); !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		if err != nil {
			t.Fatalf("poll pidfd of %d: %v", p, err)
		}
		if n == 0 {
			out = append(out, p)
		}
	}
	return out
}

// With the lock server unreachable (the proxy holds every byte), a CMD
// whose whole tree ignores SIGTERM is dead before another client can be
// granted the key, and dlock does not claim it was stopped.
// Symptom: the next holder's command ran alongside the old tree for up to --grace.
func TestRun_TreeDeadBeforeLeaseCanPass_Partition(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	p := testserver.StartProxy(t, srv.Addr())
	holder, errb := testTreeDeadBeforeLeaseCanPass(t, "redis://"+p.Addr(), "300.1101", func(*exec.Cmd) { p.Stall() }, redisContender(t, srv))
	p.Heal() // dlock's release goes through, to a key that is no longer its own
	if code := waitExit(t, holder); code != exitLost {
		t.Errorf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	if s := errb.String(); strings.Contains(s, "stopped") || strings.Contains(s, "stuck") {
		t.Errorf("stderr says dlock was stopped, but the renewals only failed: %s", s)
	}
	if s := errb.String(); strings.Count(s, "LOCK LOST") != 1 {
		t.Errorf("stderr does not say LOCK LOST once: %s", s)
	}
}

// The same with dlock SIGSTOPped: the supervisor, which keeps the lease
// deadline itself, kills the tree on the same schedule.
// Symptom: the supervisor sent SIGTERM at the deadline and SIGKILL --grace after the lease had passed.
func TestRun_TreeDeadBeforeLeaseCanPass_Stopped(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	holder, errb := testTreeDeadBeforeLeaseCanPass(t, "redis://"+srv.Addr(), "300.1102", func(h *exec.Cmd) {
		if err := syscall.Kill(h.Process.Pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(h.Process.Pid, syscall.SIGCONT) })
	}, redisContender(t, srv))
	if err := syscall.Kill(holder.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != exitLost {
		t.Errorf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	if !strings.Contains(errb.String(), "not renewed") {
		t.Errorf("stderr does not say the lease was not renewed: %s", errb.String())
	}
}

// The same on etcd, whose lease the server expires by itself: with the
// link stalled, the tree is dead before etcd can grant the key again.
// Symptom: the next holder's command ran alongside the old tree for up to --grace.
func TestRun_TreeDeadBeforeLeaseCanPass_PartitionEtcd(t *testing.T) {
	t.Parallel()
	s := startServe(t)
	addr := strings.TrimPrefix(s.url, "etcd://")
	p := testserver.StartProxy(t, addr)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: hang})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The CLI's Locker for an etcd:// URL without a path.
	l := etcdlock.New(c, etcdlock.WithPrefix(""))
	holder, errb := testTreeDeadBeforeLeaseCanPass(t, "etcd://"+p.Addr(), "300.1103", func(*exec.Cmd) { p.Stall() },
		func(ctx context.Context) (*dlock.Lock, error) {
			return l.Acquire(ctx, "k", dlock.WithTTL(3*time.Second), dlock.WithWait(hang))
		})
	p.Heal()
	if code := waitExit(t, holder); code != exitLost {
		t.Errorf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
}

// redisContender takes the key "k" on srv, waiting for it.
func redisContender(t *testing.T, srv *testserver.Redis) func(context.Context) (*dlock.Lock, error) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	return func(ctx context.Context) (*dlock.Lock, error) {
		return redislock.New(c).Acquire(ctx, "k", dlock.WithTTL(3*time.Second), dlock.WithWait(hang))
	}
}

// testTreeDeadBeforeLeaseCanPass runs a tree that ignores SIGTERM (sh and
// two sleeps) under dlock run on url, calls cut to stop the renewals, and
// takes the key with contend (a client of the server that does not go
// through the cut): by the moment the grant returns, every process of the
// tree must have exited.
func testTreeDeadBeforeLeaseCanPass(t *testing.T, url, m string, cut func(*exec.Cmd), contend func(context.Context) (*dlock.Lock, error)) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	killMarked(t, m)
	script := `trap '' TERM; sleep "$0" & sleep "$0" & echo $$; wait`
	holder, errb, out := background(t, url, "run", "--ttl", "3s", "--grace", "5s", "k", "--", "sh", "-c", script, m)
	sh, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(out.String(), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("CMD printed %q", out.String())
	}
	waitFor(t, hang, "the two sleeps never started", func() bool { return len(sleeps(m)) == 2 })
	fds := openPidfds(t, append(sleeps(m), sh))
	cut(holder)

	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	lk, err := contend(ctx)
	if err != nil {
		t.Fatalf("second client: %v; first dlock's stderr %s", err, errb.String())
	}
	left := runningNow(t, fds)
	releaseNow("test", lk, io.Discard)
	if len(left) > 0 {
		t.Errorf("another client was granted the key while pid %v of the first tree still ran; stderr %s", left, errb.String())
	}
	waitGone(t, "the first tree", func() []int { return runningNow(t, fds) })
	return holder, errb
}
