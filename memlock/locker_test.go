package memlock_test

import (
	"testing"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*memlock.Locker)(nil))
	(*memlock.Locker)(nil).Expire("k") // does nothing, no panic
	new(memlock.Locker).Expire("k")    // the zero Locker's neither
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	dlocktest.TestRefusesForeignOption(t, memlock.New(dlocktest.ForeignOption()))
}
