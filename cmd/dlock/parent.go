package main

import (
	"os"
	"time"
)

// parentPoll is how often watchParent looks at the parent process id.
const parentPoll = 100 * time.Millisecond

// watchParent returns a channel closed once the process that started
// dlock is gone (dlock was then handed to another parent, so getppid
// changes), and a function that stops watching. A dlock started by init
// (parent 1) has no parent to lose: the channel never closes.
func watchParent() (gone <-chan struct{}, stop func()) {
	ppid := os.Getppid()
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
