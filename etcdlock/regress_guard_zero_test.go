package etcdlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// The zero Guard (declared as a value, or a literal that forgot NewGuard)
// fails every call with ErrNilClient, as a nil client does, like the zero
// Locker, instead of panicking on its nil client. (Red-team reproducer.)
func TestRegressZeroGuard(t *testing.T) {
	t.Parallel()
	var g etcdlock.Guard
	ctx := context.Background()
	f := dlock.Fence{Token: 1, Owner: "o"}
	for name, fn := range map[string]func() error{
		"Put":     func() error { return g.Put(ctx, "r", f, "n", "v") },
		"Get":     func() error { _, _, err := g.Get(ctx, "r", f, "n"); return err },
		"Txn":     func() error { _, err := g.Txn(ctx, "r", f); return err },
		"Highest": func() error { _, err := g.Highest(ctx, "r"); return err },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s on the zero Guard panicked: %v", name, r)
				}
			}()
			if err := fn(); !errors.Is(err, dlock.ErrNilClient) {
				t.Errorf("%s on the zero Guard = %v, want ErrNilClient", name, err)
			}
		}()
	}
}

// Regression (red team, issue 10): QueuePrefix on the zero Locker panicked.
func TestRegressQueuePrefixOfZeroLocker(t *testing.T) {
	t.Parallel()
	var zero etcdlock.Locker
	if got := zero.QueuePrefix("a/b"); got != "a%2Fb/" {
		t.Fatalf("zero Locker QueuePrefix %q", got)
	}
	if got := etcdlock.New(nil).QueuePrefix("k"); got != "k/" {
		t.Fatalf("refused Locker QueuePrefix %q", got)
	}
}
