package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// orphanParent plays a harness that dies mid-case: it starts a worker
// (stopped, as in a client pause), a redis-server and a shimmed
// redis-server, prints their pids and waits to be killed.
func orphanParent() {
	h := &tb{}
	h.root = os.Getenv("DLOCK_SAFETY_ORPHAN_ROOT")
	dir := h.TempDir()
	c := caseSpec{backend: "file", fault: "client-pause", ttl: time.Second, dur: time.Minute}
	w := startWorker(h, dir, "file:"+h.TempDir(), 0, c, c.dur, 1)
	w.cmd.Process.Signal(syscall.SIGSTOP)
	r := testserver.StartRedis(h)
	pids := []int{w.cmd.Process.Pid, redisPid(r.Port())}
	if s := startShimmedRedis(h); s != nil {
		port, _ := strconv.Atoi(s.addr[strings.LastIndexByte(s.addr, ':')+1:])
		pids = append(pids, redisPid(port))
	}
	for _, p := range pids {
		fmt.Println(p)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	os.Exit(0)
}

// redisPid finds the redis-server of port among this process's children
// (redis-server rewrites its title to "redis-server 127.0.0.1:PORT").
func redisPid(port int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) && strings.Contains(string(cmdline), "redis-server") &&
			(strings.Contains(string(cmdline), ":"+strconv.Itoa(port)) || strings.Contains(string(cmdline), "\x00"+strconv.Itoa(port)+"\x00")) {
			return pid
		}
	}
	return -1
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}

// Symptom: a harness killed mid-case left its workers and redis-servers running.
// A harness killed mid-case (make's timeout, ^C on go run, an OOM kill)
// takes its children with it: workers (a stopped one too) and
// redis-servers, which would otherwise hold ports and CPU.
func TestHarnessDeath_EndsItsChildren(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parent := exec.Command(exe, "orphan-parent")
	parent.Env = append(os.Environ(), "DLOCK_SAFETY_ORPHAN_ROOT="+t.TempDir())
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	parent.Stderr = os.Stderr
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		pid, err := strconv.Atoi(sc.Text())
		if err != nil || pid <= 0 {
			parent.Process.Kill()
			parent.Wait()
			t.Fatalf("orphan-parent said %q", sc.Text())
		}
		pids = append(pids, pid)
	}
	t.Cleanup(func() { // whatever the verdict, end what the test started
		for _, p := range pids {
			if alive(p) {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	if len(pids) < 2 {
		parent.Process.Kill()
		parent.Wait()
		t.Fatalf("orphan-parent started %v", pids)
	}
	parent.Process.Kill()
	parent.Wait()
	time.Sleep(2 * time.Second)
	for i, p := range pids {
		if alive(p) {
			t.Errorf("child %d (pid %d) of the killed harness still runs", i, p)
		}
	}
}
