package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// gone bounds the wait for killed processes to disappear.
const gone = 10 * time.Second

// withArg returns the pids of processes with arg among their arguments
// (argv[1:]). Marker arguments such as "300.123" (sleep 300.123) make a
// test's processes findable; dlock's own command line holds them too, so
// callers that want only the sleeps use sleeps.
func withArg(arg string) []int {
	var out []int
	names, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		for _, a := range argv[1:] {
			if a == arg {
				pid, _ := strconv.Atoi(strings.Split(n, "/")[2])
				if alive(pid) {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}

// sleeps returns the live `sleep MARKER` processes.
func sleeps(marker string) []int {
	var out []int
	for _, pid := range withArg(marker) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Equal(b, []byte("sleep\x00"+marker+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// killMarked kills whatever still carries marker: no test leaves strays,
// even when it fails.
func killMarked(t *testing.T, markers ...string) {
	t.Cleanup(func() {
		for _, m := range markers {
			for _, pid := range withArg(m) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// waitUntil polls cond until it holds (true) or d passes (false).
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// waitFor polls cond until it holds or the bound passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitGone(t *testing.T, what string, pids func() []int) {
	t.Helper()
	var left []int
	waitFor(t, gone, what+" still running", func() bool { left = pids(); return len(left) == 0 })
}

// The lock is lost (its key deleted behind dlock's back): every process of
// CMD's tree dies, not only CMD.
func TestLostLockKillsWholeTree(t *testing.T) {
	t.Parallel()
	const m = "300.101"
	killMarked(t, m)
	srv := testserver.StartRedis(t)
	url := "redis://" + srv.Addr()
	holder, errb, _ := background(t, url, "run", "--ttl", "5s", "--grace", "1s", "tree", "--",
		"sh", "-c", "sleep "+m+" & sleep "+m+" & echo started; wait")
	waitFor(t, hang, "the two sleeps never started", func() bool { return len(sleeps(m)) == 2 })

	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	if err := c.Del(context.Background(), redislock.New(c).LockKey("tree")).Err(); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, holder); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
	}
	waitGone(t, "grandchildren of a lost lock", func() []int { return sleeps(m) })
	if !strings.Contains(errb.String(), "LOCK LOST") {
		t.Fatalf("stderr: %s", errb.String())
	}
}

// dlock SIGKILLed: the whole tree dies, including processes that left
// CMD's process group and session (setsid) and orphans of a daemon-style
// double fork, which the supervisor, a subreaper, still finds.
func TestKilledDlockKillsWholeTree(t *testing.T) {
	t.Parallel()
	const inGroup, setsid, orphan = "300.201", "300.202", "300.203"
	killMarked(t, inGroup, setsid, orphan)
	script := fmt.Sprintf(`sleep %s & setsid sleep %s & setsid sh -c 'sleep %s & exit 0'; echo started; wait`, inGroup, setsid, orphan)
	holder, _, _ := background(t, fileURL(t), "run", "k", "--", "sh", "-c", script)
	waitFor(t, hang, "the sleeps never started", func() bool {
		return len(sleeps(inGroup)) == 1 && len(sleeps(setsid)) == 1 && len(sleeps(orphan)) == 1
	})
	holder.Process.Kill()
	waitExit(t, holder)
	// Every process carrying a marker: the sleeps, sh, the supervisor.
	for _, m := range []string{inGroup, setsid, orphan} {
		waitGone(t, "the tree of a killed dlock (marker "+m+")", func() []int { return withArg(m) })
	}
}

// SIGTERM sent to dlock reaches CMD's process group, grandchildren
// included, exactly once.
func TestSIGTERMReachesGroupOnce(t *testing.T) {
	t.Parallel()
	const m = "300.301"
	killMarked(t, m)
	// The grandchild counts TERMs for about a second after the first,
	// then exits; CMD counts its own and waits for it, then exits 7.
	gc := `trap 'echo gcTERM; t=1' TERM; echo started; i=0; while [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); if [ -n "$t" ]; then t=$((t+1)); [ $t -gt 20 ] && exit 0; fi; done`
	script := fmt.Sprintf(`trap 'echo cmdTERM' TERM; sh -c '%s' %s & wait; wait; exit 7`, strings.ReplaceAll(gc, "'", `'\''`), m)
	holder, errb, out := background(t, fileURL(t), "run", "k", "--", "sh", "-c", script)
	holder.Process.Signal(syscall.SIGTERM)
	if code := waitExit(t, holder); code != 7 {
		t.Fatalf("exit %d, want CMD's 7; stdout %q stderr %q", code, out.String(), errb.String())
	}
	if n := strings.Count(out.String(), "cmdTERM"); n != 1 {
		t.Errorf("CMD got SIGTERM %d times, want 1: %q", n, out.String())
	}
	if n := strings.Count(out.String(), "gcTERM"); n != 1 {
		t.Errorf("the grandchild got SIGTERM %d times, want 1: %q", n, out.String())
	}
}

// What CMD leaves running is killed before the lock is released, and dlock
// still exits with CMD's status.
func TestLeftoversKilledBeforeRelease(t *testing.T) {
	t.Parallel()
	const polite, stubborn = "300.401", "300.402"
	killMarked(t, polite, stubborn)
	url := fileURL(t)
	// The stubborn leftover ignores SIGTERM: SIGKILL after --grace.
	script := fmt.Sprintf(`sleep %s & (trap '' TERM; exec sleep %s) & echo started; exit 5`, polite, stubborn)
	holder, errb, _ := background(t, url, "run", "--grace", "2s", "k", "--", "sh", "-c", script)
	// A second dlock waits for the lock; once it has it, nothing of the
	// first tree may be alive.
	waiter, _, _ := background(t, url, "run", "k", "--", "sh", "-c", "echo acquired; sleep 0.1")
	if left := append(sleeps(polite), sleeps(stubborn)...); len(left) > 0 {
		t.Errorf("the lock was released while pid %v (left by the first CMD) still ran", left)
	}
	if code := waitExit(t, holder); code != 5 {
		t.Fatalf("exit %d, want CMD's 5; stderr %s", code, errb.String())
	}
	waitExit(t, waiter)
	for _, want := range []string{"still run", "SIGTERM", "SIGKILL"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q: %s", want, errb.String())
		}
	}
}

func TestExitStatusPassthrough(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	notExec := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"true"}, 0, ""},
		{[]string{"sh", "-c", "exit 42"}, 42, ""},
		{[]string{"sh", "-c", "sleep 300.501 & exit 9"}, 9, ""},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + 15, ""},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + 9, ""},
		{[]string{"no-such-command-dlock-test"}, exitNoExec, "no-such-command-dlock-test"},
		{[]string{notExec}, exitCannotExec, "permission denied"},
		{[]string{"/nonexistent/cmd"}, exitNoExec, "/nonexistent/cmd"},
	}
	killMarked(t, "300.501")
	for _, c := range cases {
		r := runDlock(t, url, append([]string{"run", "--grace", "1s", "k", "--"}, c.args...)...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: exit %d %q, want %d and %q", c.args, r.code, r.stderr, c.code, c.want)
		}
	}
	if left := sleeps("300.501"); len(left) > 0 {
		t.Errorf("leftover %v survived dlock", left)
	}
}

// The supervisor SIGKILLed (the OOM killer's choice): CMD dies of its
// parent-death signal, its orphans come to dlock (a subreaper too), which
// kills them, then releases the lock.
func TestKilledSupervisor(t *testing.T) {
	t.Parallel()
	const m = "300.601"
	killMarked(t, m)
	url := fileURL(t)
	holder, errb, _ := background(t, url, "run", "--verbose", "k", "--", "sh", "-c", "setsid sleep "+m+" & echo started; wait")
	var sup int
	re := regexp.MustCompile(`supervisor pid (\d+)`)
	waitFor(t, hang, "no supervisor pid in --verbose output", func() bool {
		mm := re.FindStringSubmatch(errb.String())
		if mm != nil {
			sup, _ = strconv.Atoi(mm[1])
		}
		return sup > 0 && len(sleeps(m)) == 1
	})
	syscall.Kill(sup, syscall.SIGKILL)
	if code := waitExit(t, holder); code != 128+9 {
		t.Fatalf("exit %d, want 137; stderr %s", code, errb.String())
	}
	waitGone(t, "the tree of a killed supervisor", func() []int { return withArg(m) })
	if r := runDlock(t, url, "run", "-n", "k", "--", "true"); r.code != 0 {
		t.Fatalf("lock not released: %d %s", r.code, r.stderr)
	}
}

func TestSuperviseIsInternal(t *testing.T) {
	t.Parallel()
	r := runDlock(t, fileURL(t), superviseCmd, "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "internal") {
		t.Fatalf("dlock %s by hand: %d %q", superviseCmd, r.code, r.stderr)
	}
}

// Signals dlock was started with ignored (nohup, "&" in a script) stay
// ignored for CMD: dlock must not undo nohup.
func TestIgnoredSignalsStayIgnored(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	// sh ignores SIGHUP and execs dlock, as nohup does.
	cmd := dlockCmd(ctx, fileURL(t))
	cmd.Path, cmd.Args = "/bin/sh", []string{"sh", "-c", `trap '' HUP; exec "$0" run k -- sh -c 'grep SigIgn /proc/$$/status'`, bin}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("CMD printed %q", out)
	}
	mask, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil || mask&(1<<(uint(syscall.SIGHUP)-1)) == 0 {
		t.Fatalf("CMD does not ignore SIGHUP: SigIgn %s (%v)", f[1], err)
	}
	// The supervisor ignores SIGTTOU; CMD must not inherit that.
	if mask&(1<<(uint(syscall.SIGTTOU)-1)) != 0 {
		t.Fatalf("CMD ignores SIGTTOU: SigIgn %s", f[1])
	}
}

// SIGKILL to dlock's whole job (kill -9 %1, a process-group kill) does
// not reach the supervisor, which has a group of its own: it sees dlock
// gone and kills the whole tree, processes that left CMD's session too.
// (With the supervisor in dlock's group, both would die at once and only
// CMD, by its parent-death signal, would be sure to follow.)
func TestKilledJobKillsWholeTree(t *testing.T) {
	t.Parallel()
	const setsid, orphan = "300.901", "300.902"
	killMarked(t, setsid, orphan)
	script := fmt.Sprintf(`setsid sleep %s & setsid sh -c 'sleep %s & exit 0'; echo started; wait`, setsid, orphan)
	holder := dlockCmd(context.Background(), fileURL(t), "run", "k", "--", "sh", "-c", script)
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own
	holder.WaitDelay = 5 * time.Second
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, holder) })
	waitFor(t, hang, "the sleeps never started", func() bool { return len(sleeps(setsid)) == 1 && len(sleeps(orphan)) == 1 })
	if err := syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExit(t, holder)
	for _, m := range []string{setsid, orphan} {
		waitGone(t, "the tree of a killed job (marker "+m+")", func() []int { return withArg(m) })
	}
}

// Symptom: dlock exited 0 and released the lock with the leftover running on under init.
// The supervisor SIGKILLed while it waits out --grace for what CMD left
// running: the leftover comes to dlock (a subreaper too), which must kill
// it before releasing the lock, and say so.
func TestSupervisorKilledDuringGrace(t *testing.T) {
	t.Parallel()
	const m = "300.801"
	killMarked(t, m)
	url := fileURL(t)
	script := fmt.Sprintf(`(trap '' TERM; exec sleep %s) & echo started; exit 0`, m)
	holder, errb, _ := background(t, url, "run", "--verbose", "--grace", "60s", "k", "--", "sh", "-c", script)
	var sup int
	re := regexp.MustCompile(`supervisor pid (\d+)`)
	waitFor(t, hang, "the supervisor never started waiting out --grace", func() bool {
		if mm := re.FindStringSubmatch(errb.String()); mm != nil {
			sup, _ = strconv.Atoi(mm[1])
		}
		return sup > 0 && strings.Contains(errb.String(), "still run") && len(sleeps(m)) == 1
	})
	syscall.Kill(sup, syscall.SIGKILL)
	// Once a second dlock has the lock, nothing of the first tree may run.
	waiter, _, _ := background(t, url, "run", "k", "--", "sh", "-c", "echo acquired")
	if left := sleeps(m); len(left) > 0 {
		t.Errorf("the lock was released while pid %v (left by the first CMD) still ran", left)
	}
	if code := waitExit(t, holder); code != 0 {
		t.Errorf("exit %d, want CMD's 0; stderr %s", code, errb.String())
	}
	waitExit(t, waiter)
	if s := errb.String(); !strings.Contains(s, "supervisor died") || !strings.Contains(s, "killed 1 ") {
		t.Errorf("stderr does not report the supervisor's death and the killed leftover: %s", s)
	}
}

// On a lost lock CMD gets SIGTERM once, whether the key was deleted or
// the lock server became unreachable: a bash TERM trap runs once.
// Symptom: CMD's TERM trap ran twice on a lost lock.
func TestRun_SigtermOnceOnLoss(t *testing.T) {
	t.Parallel()
	for _, lose := range []string{"KeyDeleted", "Partition"} {
		t.Run(lose, func(t *testing.T) {
			t.Parallel()
			srv := testserver.StartRedis(t)
			p := testserver.StartProxy(t, srv.Addr())
			traps := filepath.Join(t.TempDir(), "traps")
			// The trap does not end CMD: SIGKILL does, at the kill point.
			script := `trap 'echo TERM >> "$0"' TERM; echo started; i=0; while [ $i -lt 2000 ]; do sleep 0.05 & wait $!; i=$((i+1)); done`
			holder, errb, _ := background(t, "redis://"+p.Addr(), "run", "--ttl", "3s", "k", "--", "bash", "-c", script, traps)
			switch lose {
			case "KeyDeleted":
				c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
				defer c.Close()
				if err := c.Del(context.Background(), redislock.New(c).LockKey("k")).Err(); err != nil {
					t.Fatal(err)
				}
			case "Partition":
				p.Stall()
				waitFor(t, hang, "the tree was never sent SIGTERM", func() bool { _, err := os.Stat(traps); return err == nil })
				p.Heal()
			}
			if code := waitExit(t, holder); code != exitLost {
				t.Fatalf("exit %d, want %d; stderr %s", code, exitLost, errb.String())
			}
			b, err := os.ReadFile(traps)
			if err != nil {
				t.Fatalf("CMD's TERM trap never ran: %v; stderr %s", err, errb.String())
			}
			if n := strings.Count(string(b), "TERM"); n != 1 {
				t.Errorf("CMD's TERM trap ran %d times, want 1; stderr %s", n, errb.String())
			}
		})
	}
}

// A --grace longer than fits between SIGTERM and the kill point before
// the lease ends is shortened, with one line on stderr; the default, and
// a --grace that fits, say nothing.
// Symptom: SIGKILL came --grace after the lease had passed to the next holder.
func TestRun_GraceClampedToLease(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	r := runDlock(t, url, "run", "--ttl", "3s", "--grace", "5s", "k", "--", "true")
	if r.code != 0 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "--grace 5s") || !strings.Contains(r.stderr, "700ms") {
		t.Errorf("--ttl 3s --grace 5s: exit %d, stderr %q; want 0 and one line saying 5s is shortened to 700ms", r.code, r.stderr)
	}
	// The margin is said as it is (300ms at --ttl 3s), not as a formula
	// that is wrong past 10s ("TTL/10" for a margin capped at 1s).
	if !strings.Contains(r.stderr, "300ms kill margin") || strings.Contains(r.stderr, "TTL/10") {
		t.Errorf("--ttl 3s --grace 5s: stderr %q; want the 300ms kill margin named", r.stderr)
	}
	for _, args := range [][]string{{"--ttl", "3s"}, {"--ttl", "30s", "--grace", "5s"}, {"--ttl", "3s", "--grace", "700ms"}} {
		r := runDlock(t, url, append(append([]string{"run"}, args...), "k", "--", "true")...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing", args, r.code, r.stderr)
		}
	}
}
