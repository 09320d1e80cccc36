package etcdlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Regression (issue 10 red team): the default guard prefix was
// "dlock/guard/", inside the queue directory "dlock/" of a lock named
// "dlock" (the default lock prefix is empty), so a Guard's fence keys
// stood in that lock's queue ahead of every holder and blocked it.
func TestRegressGuardKeysOutsideLockQueues(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	ctx := dlocktest.Context(t)
	client := newClient(t, c.Endpoints())
	g := etcdlock.NewGuard(client)
	if err := g.Put(ctx, "r", dlock.Fence{Token: 7, Owner: "o"}, "n", "v"); err != nil {
		t.Fatal(err)
	}
	l := etcdlock.New(client)
	for _, key := range []string{"dlock", "dlock%guard", "dlock%25guard"} {
		lk, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("lock %q with a default Guard's keys present: %v", key, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := l.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 0 {
		t.Fatalf("List shows the guard's keys as locks: %+v", infos)
	}
}
