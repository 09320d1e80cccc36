//go:build linux

package dlocktest

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The time the process was stopped counts as stalled: a deadline check
// that subtracts it must not fail a call that returned as soon as the
// process ran again.
func TestStallMeter_CountsTimeTheProcessWasStopped(t *testing.T) {
	const stopped = 500 * time.Millisecond
	m := StartStallMeter(time.Now())
	pid := strconv.Itoa(os.Getpid())
	// The continuer waits until this process has stopped, so the SIGCONT
	// can never come first; it sends it after 10s whatever it saw, so the
	// test process is never left stopped.
	cont := exec.Command("sh", "-c", `i=0; while ! grep -q '^State:.*T' /proc/$0/status && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done; sleep `+
		strconv.FormatFloat(stopped.Seconds(), 'f', 3, 64)+`; kill -CONT $0`, pid)
	if err := cont.Start(); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
	runtime.UnlockOSThread()
	if err := cont.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := m.Stop(); got < stopped-stallTick-stallSlack {
		t.Fatalf("stalled %v, want at least the %v the process was stopped", got, stopped)
	}
	if got := m.Longest(); got < stopped-stallTick-stallSlack {
		t.Fatalf("longest stall %v, want at least the %v the process was stopped", got, stopped)
	}
}

// A stall that ended before from does not count.
func TestStallMeter_IgnoresStallsBeforeFrom(t *testing.T) {
	m := StartStallMeter(time.Now().Add(time.Hour))
	time.Sleep(3 * stallTick)
	if got := m.Stop(); got != 0 {
		t.Fatalf("stalled %v before from, want 0", got)
	}
}
