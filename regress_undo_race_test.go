package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// failAtDeadline fails every attempt with an error of unknown outcome
// (not "held"), returned just as the caller's context ends, and counts the
// undos it is asked for.
type failAtDeadline struct{ aborts atomic.Int32 }

var errReset = errors.New("connection reset")

func (d *failAtDeadline) Spec() driver.Spec { return driver.Spec{Name: "fail-at-deadline"} }

func (d *failAtDeadline) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	<-ctx.Done()
	return driver.Grant{}, errReset
}

func (d *failAtDeadline) Abort(ctx context.Context, req *driver.Request) error {
	d.aborts.Add(1)
	return nil
}

// Regression (red team, issue 10): the background undo of an attempt
// whose outcome is unknown read the attempt's named error result while
// the return statement wrote it (a data race under -race).
func TestRegressUndoReadsItsOwnError(t *testing.T) {
	d := &failAtDeadline{}
	e := dlock.NewEngine(d)
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := e.Acquire(ctx, "k")
		cancel()
		if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, errReset) {
			t.Fatalf("err = %v, want ErrUnavailable joined with the driver's error", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for d.aborts.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := d.aborts.Load(); n < 5 {
		t.Fatalf("%d undos, want one per failed attempt (5)", n)
	}
}
