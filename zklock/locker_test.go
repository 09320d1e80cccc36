package zklock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/zklock"
)

// A reply that is there when the request timeout fires is taken, also by
// a caller that was not running while its reply came and the timeout
// passed (a loaded machine).
// Symptom: a healthy server reported as silent (no answer within the request timeout) on a loaded machine.
func TestCall_TakesReplyReadyWhenRequestTimeoutFires(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	const timeout = time.Millisecond
	l := zklock.New(connect(t, []string{z.Addr()}), zklock.WithRequestTimeout(timeout))
	var hung atomic.Bool
	zklock.SetHooks(l, &zklock.Hooks{Waiting: func(replied func() bool) {
		for end := time.Now().Add(dlocktest.HangTimeout); !replied(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				hung.Store(true)
				return
			}
		}
		time.Sleep(2 * timeout) // the request timeout has passed too
	}})
	defer zklock.SetHooks(l, nil)
	// Each call's select would pick the timeout half the time: 20 cycles
	// of several calls each do not all pass by chance.
	for i := 0; i < 20; i++ {
		lk, err := l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t))
		if err != nil {
			t.Fatalf("cycle %d: TryAcquire whose every reply came before its request timeout was read: %v", i, err)
		}
		if err := lk.Release(context.Background()); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
	}
	if hung.Load() {
		t.Fatalf("hang: a request had no reply within %v", dlocktest.HangTimeout)
	}
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*zklock.Locker)(nil))
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	z := sharedZooKeeper(t)
	dlocktest.TestRefusesForeignOption(t, zklock.New(connect(t, []string{z.Addr()}), dlocktest.ForeignOption()))
}
