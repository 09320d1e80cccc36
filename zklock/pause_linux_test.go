package zklock_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// pause hangs z (SIGSTOP) and returns once every thread of its process
// has stopped. The kernel acts on a process-directed SIGSTOP when one of
// the process's threads next runs: until then, on a loaded machine, the
// "paused" server goes on answering (a Break against it can succeed).
func pause(t testing.TB, z *testserver.ZooKeeper) {
	t.Helper()
	pid := serverPID(t, z)
	z.Pause()
	// Whatever fails before the test resumes z, z does not stay paused
	// under the tests that run next (a SIGCONT to a running server is a
	// no-op).
	t.Cleanup(z.Resume)
	end := time.Now().Add(dlocktest.HangTimeout)
	for !allStopped(pid) {
		if time.Now().After(end) {
			t.Fatalf("hang: ZooKeeper %s (pid %d) not stopped %v after SIGSTOP", z.Addr(), pid, dlocktest.HangTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// serverPID finds z's process: the java process whose command line names
// z's directory (the parent of its log).
func serverPID(t testing.TB, z *testserver.ZooKeeper) int {
	t.Helper()
	arg := []byte("-Dzookeeper.log.dir=" + filepath.Dir(z.LogPath()) + "\x00")
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, arg) {
			return pid
		}
	}
	t.Fatalf("no process of ZooKeeper %s (%s)", z.Addr(), arg)
	return 0
}

// allStopped reports whether every thread of pid is stopped (state T),
// or gone.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return true // the process is gone
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		if st := b[i+2]; !strings.ContainsRune("TtZX", rune(st)) {
			return false
		}
	}
	return true
}
