package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// noBreak is a driver without driver.Breaker.
type noBreak struct{}

func (noBreak) Spec() driver.Spec { return driver.Spec{Name: "nobreak"} }
func (noBreak) Try(context.Context, *driver.Request) (driver.Grant, error) {
	return driver.Grant{}, errors.New("unused")
}

// plainLocker is a Locker without a Break method.
type plainLocker struct{ dlock.Locker }

func TestBreakUnsupported(t *testing.T) {
	ctx := context.Background()
	if _, err := dlock.NewEngine(noBreak{}).Break(ctx, "k", ""); !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "nobreak") {
		t.Errorf("Engine.Break over a driver without Breaker = %v, want ErrUnsupported naming the backend", err)
	}
	if _, err := dlock.Break(ctx, plainLocker{memlock.New()}, "k", ""); !errors.Is(err, dlock.ErrUnsupported) {
		t.Errorf("Break on a Locker without Break = %v, want ErrUnsupported", err)
	}
	if _, err := dlock.NewEngine(driver.Failed(dlock.ErrNilClient)).Break(ctx, "k", ""); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Break on a failed engine = %v, want its error", err)
	}
	var zero *dlock.Engine
	if _, err := zero.Break(ctx, "k", ""); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Break on a nil engine = %v, want ErrNilClient", err)
	}
}

func TestValidateOwner(t *testing.T) {
	if o, err := dlock.ValidateOwner("0123456789ABCDEF0123456789abcdef"); err != nil || o != "0123456789abcdef0123456789abcdef" {
		t.Errorf("ValidateOwner(mixed case) = %q, %v", o, err)
	}
	if o, err := dlock.ValidateOwner(""); err != nil || o != "" {
		t.Errorf("ValidateOwner(\"\") = %q, %v", o, err)
	}
	if _, err := dlock.ValidateOwner(strings.Repeat("z", 32)); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("ValidateOwner(non-hex) = %v", err)
	}
}

func TestNotHolderErrorText(t *testing.T) {
	e := &dlock.NotHolderError{Key: "k", Owner: "ab", Holders: []dlock.Holder{{Owner: "0123456789abcdef", Token: 7, Metadata: map[string]string{dlock.MetaHost: "h", dlock.MetaPID: "9"}}}}
	want := `dlock: lock "k" is not held by owner ab: held by owner 0123456789ab (host=h pid=9) token 7`
	if e.Error() != want || !errors.Is(e, dlock.ErrNotHolder) {
		t.Errorf("Error() = %q, want %q", e.Error(), want)
	}
	if s := (&dlock.NotHolderError{Key: "k", Owner: "ab"}).Error(); !strings.HasSuffix(s, "the key is free") {
		t.Errorf("free key: %q", s)
	}
}

// An operator breaks a stuck lock: the holder is named, and the next
// holder's token is above the broken one's.
func ExampleBreak() {
	ctx := context.Background()
	locker := memlock.New()
	stuck, _ := locker.Acquire(ctx, "nightly-batch", dlock.WithMetadata("job", "backup"))

	broken, err := dlock.Break(ctx, locker, "nightly-batch", "") // "" breaks whoever holds it
	if err != nil {
		fmt.Println("break:", err)
		return
	}
	for _, h := range broken.Holders {
		fmt.Println("broke the lock of job", h.Metadata["job"], "owner ok:", h.Owner == stuck.Owner(), "token ok:", h.Token == stuck.Token())
	}
	next, _ := locker.Acquire(ctx, "nightly-batch")
	fmt.Println("next token higher:", next.Token() > stuck.Token())
	fmt.Println("broken holder's release is a loss:", errors.Is(stuck.Release(ctx), dlock.ErrLockLost))
	next.Release(ctx)

	// With the holder's owner id, only that holder's lease is released.
	_, err = dlock.Break(ctx, locker, "nightly-batch", stuck.Owner())
	fmt.Println("not the holder:", errors.Is(err, dlock.ErrNotHolder))
	// Output:
	// broke the lock of job backup owner ok: true token ok: true
	// next token higher: true
	// broken holder's release is a loss: true
	// not the holder: true
}

// hungBreak is a driver whose Break calls sent, then never answers until
// release is closed.
type hungBreak struct {
	noBreak
	sent    func()
	release chan struct{}
}

func (b hungBreak) Break(context.Context, string, string) (driver.BreakResult, error) {
	b.sent()
	<-b.release
	return driver.BreakResult{}, nil
}

// A Break the service never answers returns at the context's end with
// ErrUnavailable, the context's error and the caller's own cause. Symptom:
// the cause given to context.WithCancelCause was dropped.
func TestBreak_UnansweredKeepsContextCause(t *testing.T) {
	mine := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	// The context ends once the request is with the service.
	b := hungBreak{sent: func() { cancel(mine) }, release: make(chan struct{})}
	defer close(b.release)
	_, err := dlock.NewEngine(b).Break(ctx, "k", "")
	if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.Canceled) || !errors.Is(err, mine) {
		t.Fatalf("Break = %v, want ErrUnavailable, context.Canceled and the caller's cause", err)
	}
}
