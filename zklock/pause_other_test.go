//go:build !linux

package zklock_test

import (
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

// pause hangs z (SIGSTOP). Elsewhere than on Linux it cannot tell when
// the stop took effect.
func pause(t testing.TB, z *testserver.ZooKeeper) {
	t.Helper()
	z.Pause()
	t.Cleanup(z.Resume) // never left paused under the tests that run next
}
