package testserver

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// serverProcAttr puts a server in its own process group (a terminal's ^C
// goes to the test only) and has the kernel kill it if the process that
// started it dies, so a killed test or harness leaves no server behind.
func serverProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// StopSelf stops this process (every thread) with SIGSTOP, as a long GC
// pause or a stalled VM would, and returns once something continues it
// (SIGCONT). The signal is sent to the calling thread (tgkill), not to the
// process: a process-directed SIGSTOP may be taken by another thread, and
// until that one runs and stops the rest, the caller goes on with its next
// statements (seen on a loaded host: a "paused" process finished the write
// its pause was meant to delay). The calling thread takes a
// thread-directed one on its way out of the system call.
func StopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}

// waitStopped waits up to d until every thread of pid is stopped (state T)
// or gone.
func waitStopped(pid int, d time.Duration) error {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	for end := time.Now().Add(d); ; {
		if allStopped(dir) {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("pid %d not stopped %v after SIGSTOP", pid, d)
		}
		time.Sleep(time.Millisecond)
	}
}

func allStopped(taskDir string) bool {
	tasks, err := os.ReadDir(taskDir)
	if err != nil {
		return true // the process is gone
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(taskDir, task.Name(), "stat"))
		if err != nil {
			continue // the thread exited
		}
		i := bytes.LastIndexByte(b, ')') // "pid (comm) state ...": comm may hold ')'
		if i < 0 || i+2 >= len(b) || !bytes.ContainsRune([]byte("TtZX"), rune(b[i+2])) {
			return false
		}
	}
	return true
}
