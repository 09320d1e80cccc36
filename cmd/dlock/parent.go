package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// parentPoll is how often watchParent looks at the parent process id.
const parentPoll = 100 * time.Millisecond

// startParent is the parent process id dlock had when it started, read as
// early as the program can.
var startParent = os.Getppid()

// parentGoneAtStart says why the process that started dlock is already
// gone, or "" if it is not known to be: dlock's parent is init (or none,
// dlock being pid 1 itself), or not the one it had when it started. The
// parent cannot tell apart a process that started dlock from one dlock was
// handed to (init, or a subreaper such as dlock run's supervisor, which
// also starts CMD itself), so only these two are sure signs; a parent
// that exits from then on is watchParent's.
func parentGoneAtStart() string {
	switch ppid := os.Getppid(); {
	case ppid <= 1:
		return fmt.Sprintf("its parent process is pid %d (init): the process that started it is gone, or is init", ppid)
	case ppid != startParent:
		return fmt.Sprintf("its parent process changed from pid %d to pid %d: the process that started it is gone", startParent, ppid)
	}
	return ""
}

// watchParent returns a channel closed once the process that started
// dlock is gone (dlock was then handed to another parent, so getppid
// changes), and a function that stops watching. A dlock started by init
// (parent 1) has no parent to lose: the channel never closes.
func watchParent() (gone <-chan struct{}, stop func()) {
	ppid := startParent
	if ppid <= 1 {
		return make(chan struct{}), func() {}
	}
	return pollUntil(func() bool { return os.Getppid() != ppid })
}

// pollUntil returns a channel closed once gone reports true (asked every
// parentPoll), and a function that stops asking.
func pollUntil(gone func() bool) (<-chan struct{}, func()) {
	ch, done := make(chan struct{}), make(chan struct{})
	go func() {
		t := time.NewTicker(parentPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if gone() {
					close(ch)
					return
				}
			}
		}
	}()
	return ch, func() { close(done) }
}

// pidFlag is --parent PID: a process id, 1 included (a script run as pid
// 1 of a container passes --parent $$).
type pidFlag struct{ pid *int }

func (f pidFlag) String() string {
	if f.pid == nil || *f.pid == 0 {
		return ""
	}
	return strconv.Itoa(*f.pid)
}

func (f pidFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 {
		return errors.New("want the id of a running process (1 or more)")
	}
	*f.pid = int(n)
	return nil
}

// watchPID is watchParent for process pid (--parent), which must be
// running. A zombie (exited, not yet reaped) counts as gone. On Linux the
// process is held by a pidfd from the start (Go's os.FindProcess), so a
// process that reuses the id after pid exited is never taken for it;
// where pidfds are unavailable (an old kernel, a seccomp profile that
// refuses pidfd_open) and elsewhere, the id is polled. Pid 1 exits only
// with its PID namespace (a container), which kills dlock hold with it:
// its lease then runs out.
func watchPID(pid int) (gone <-chan struct{}, stop func(), err error) {
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Signal(syscall.Signal(0))
		if errors.Is(err, syscall.EPERM) {
			err = nil // running, as another user
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("no running process %d: %w", pid, err)
	}
	ch, stop := pollUntil(func() bool {
		err := p.Signal(syscall.Signal(0))
		return errors.Is(err, os.ErrProcessDone) || errors.Is(err, syscall.ESRCH) || zombie(pid)
	})
	return ch, stop, nil
}
