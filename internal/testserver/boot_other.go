//go:build !unix

package testserver

import "sync"

var bootMu sync.Mutex

// lockBoot serialises the boots of this process's servers (see boot.go).
func lockBoot() (unlock func()) {
	bootMu.Lock()
	return bootMu.Unlock
}
