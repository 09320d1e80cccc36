//go:build unix

package testserver

import (
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// bootLockPath is the lock a server holds while it boots, shared by every
// test process of the machine (beside the port claims).
var bootLockPath = filepath.Join(portDir, "boot.lock")

// lockBoot waits, at most bootWait, until no other server of any test
// process of the machine is booting, and returns the function that ends
// this one's boot. It does not fail: past bootWait (a queue of boots
// longer than that, or a holder that does not let go) or without a lock
// file, the boot goes ahead unserialised.
func lockBoot() (unlock func()) {
	if err := os.MkdirAll(portDir, 0o777); err != nil {
		return func() {}
	}
	f, err := os.OpenFile(bootLockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return func() {}
	}
	// A flock belongs to the open file, so the boots of one process
	// exclude each other too.
	for end := time.Now().Add(bootWait); ; time.Sleep(10 * time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil || time.Now().After(end) {
			break
		}
	}
	return func() { f.Close() }
}
