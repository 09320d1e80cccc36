package zklock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/zklock"
)

// A reply that is there when the request timeout fires is taken: a caller
// that was not running while its reply came and the timeout passed (a
// loaded machine) reported a healthy server as silent.
func TestCall_TakesReplyReadyWhenRequestTimeoutFires(t *testing.T) {
	t.Parallel()
	z := sharedZooKeeper(t)
	const timeout = time.Millisecond
	l := zklock.New(connect(t, []string{z.Addr()}), zklock.WithRequestTimeout(timeout))
	zklock.SetHooks(l, &zklock.Hooks{Waiting: func(replied func() bool) {
		for end := time.Now().Add(dlocktest.HangTimeout); !replied(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Errorf("hang: no reply within %v", dlocktest.HangTimeout)
				return
			}
		}
		time.Sleep(2 * timeout) // the request timeout has passed too
	}})
	lk, err := l.TryAcquire(dlocktest.Context(t), dlocktest.Key(t))
	if err != nil {
		t.Fatalf("TryAcquire whose every reply came before its request timeout was read: %v", err)
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
