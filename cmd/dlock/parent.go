package main

import (
	"fmt"
	"os"
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
	ch, done := make(chan struct{}), make(chan struct{})
	if ppid <= 1 {
		return ch, func() {}
	}
	go func() {
		t := time.NewTicker(parentPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if os.Getppid() != ppid {
					close(ch)
					return
				}
			}
		}
	}()
	return ch, func() { close(done) }
}
