package etcdlock_test

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/etcdlock/etcdtest"
)

// Red-team review 2, finding 2: doc.go said that a dlock key with '/' or
// '%' and the etcdctl/concurrency.Mutex lock of the same name do not
// exclude each other, which is true, but implied that such keys meet no
// foreign lock at all. etcd's recipe knows no escaping: a Mutex whose raw
// name is a dlock key's escaped form shares its queue directory, and a
// Mutex whose name extends a dlock key's directory with "/..." has its
// entries inside it (the queue of "d" is the prefix "d/", which holds
// "d/e"'s entries). This test pins down what the package documentation
// now states, both ways round.
func TestForeignLocksOnEscapedNames(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints())
	l := etcdlock.New(newClient(t, c.Endpoints()))
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := dlocktest.Key(t)
	for _, tc := range []struct {
		dlockKey, mutexName string
		mutexBlocksDlock    bool
		dlockBlocksMutex    bool
	}{
		// Same name, neither '/' nor '%': etcd's layout, mutual exclusion.
		{base + "p", base + "p", true, true},
		// The raw name equals the escaped form: the same directory.
		{base + "a%", base + "a%25", true, true},
		{base + "b/c", base + "b%2Fc", true, true},
		// The raw name extends the escaped form with "/...": its entries
		// are in dlock's directory, not the other way round.
		{base + "d", base + "d/e", true, false},
		{base + "a%", base + "a%25/x", true, false},
		// Same name with '/' or '%': different directories.
		{base + "b/c", base + "b/c", false, false},
		{base + "a%", base + "a%", false, false},
		// dlock's own hierarchy is escaped: "d/e" is not inside "d/".
		{base + "d/e", base + "d", false, false},
	} {
		name := "dlock " + tc.dlockKey + " vs Mutex " + tc.mutexName
		m := concurrency.NewMutex(s, tc.mutexName)
		if err := m.TryLock(dlocktest.Context(t)); err != nil {
			t.Fatalf("%s: Mutex.TryLock: %v", name, err)
		}
		lk, err := l.TryAcquire(dlocktest.Context(t), tc.dlockKey)
		switch {
		case err == nil:
			if tc.mutexBlocksDlock {
				t.Errorf("%s: the Mutex does not block dlock", name)
			}
			lk.Release(context.Background())
		case errors.Is(err, dlock.ErrNotAcquired):
			if !tc.mutexBlocksDlock {
				t.Errorf("%s: the Mutex blocks dlock: %v", name, err)
			}
		default:
			t.Fatalf("%s: TryAcquire: %v", name, err)
		}
		if err := m.Unlock(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}

		lk, err = l.TryAcquire(dlocktest.Context(t), tc.dlockKey)
		if err != nil {
			t.Fatalf("%s: TryAcquire with no Mutex held: %v", name, err)
		}
		m = concurrency.NewMutex(s, tc.mutexName)
		switch err := m.TryLock(dlocktest.Context(t)); {
		case err == nil:
			if tc.dlockBlocksMutex {
				t.Errorf("%s: dlock does not block the Mutex", name)
			}
			m.Unlock(dlocktest.Context(t))
		case errors.Is(err, concurrency.ErrLocked):
			if !tc.dlockBlocksMutex {
				t.Errorf("%s: dlock blocks the Mutex", name)
			}
		default:
			t.Fatalf("%s: Mutex.TryLock: %v", name, err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
}
