package guard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
)

func TestCheckerValidateOrder(t *testing.T) {
	c := guard.NewChecker("test", nil)
	if c.Backend() != "test" {
		t.Fatalf("Backend = %q", c.Backend())
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var nilCtx context.Context
	for _, tc := range []struct {
		ctx   context.Context
		res   string
		names []string
		want  error
	}{
		{nilCtx, "", []string{""}, dlock.ErrInvalidOption},
		{cancelled, "", nil, dlock.ErrInvalidKey},
		{cancelled, "r", []string{"\xff"}, dlock.ErrInvalidKey},
		{cancelled, "r", []string{"n"}, context.Canceled},
		{context.Background(), "r", []string{"n", ""}, dlock.ErrInvalidKey},
		{context.Background(), strings.Repeat("r", dlock.MaxKeyLen), []string{strings.Repeat("n", dlock.MaxKeyLen)}, nil},
	} {
		err := c.Validate(tc.ctx, tc.res, tc.names...)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("Validate(%v, %.10q, %.10q) = %v, want %v", tc.ctx, tc.res, tc.names, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "test guard") && !errors.Is(err, context.Canceled) {
			t.Errorf("error %q does not name the guard", err)
		}
	}
}

func TestCheckerReports(t *testing.T) {
	var got []dlock.Event
	obs := dlock.ObserverFunc(func(e dlock.Event) { got = append(got, e) })
	c := guard.NewChecker("test", []driver.Option{nil, dlock.WithObserver(obs)})
	hi := dlock.FenceRecord{Exclusive: dlock.Fence{Token: 5, Owner: "a"}, Seen: 5}

	next, err := c.Check("r", hi, dlock.Fence{Token: 6, Owner: "b"})
	if err != nil || next != (dlock.FenceRecord{Exclusive: dlock.Fence{Token: 6, Owner: "b"}, Seen: 6}) {
		t.Fatalf("Check(higher) = %+v, %v", next, err)
	}
	next, err = c.Check("r", hi, dlock.Fence{Token: 7, Owner: "s", Shared: true})
	if err != nil || next != (dlock.FenceRecord{Exclusive: hi.Exclusive, Seen: 7}) {
		t.Fatalf("Check(shared) = %+v, %v; want the exclusive fence unchanged and Seen 7", next, err)
	}
	if len(got) != 0 {
		t.Fatalf("admissions reported %+v", got)
	}
	next, err = c.Check("r", hi, dlock.Fence{Token: 4, Owner: "s", Shared: true})
	var st *dlock.StaleTokenError
	if next != hi || !errors.As(err, &st) || *st != (dlock.StaleTokenError{Resource: "r", Token: 4, Owner: "s", Highest: 5}) {
		t.Fatalf("Check(stale shared) = %+v, %v", next, err)
	}
	want := dlock.Event{Kind: dlock.EventRejected, Backend: "test", Key: "r", Mode: dlock.Shared, Token: 4, Owner: "s", Highest: 5}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("events %+v, want [%+v]", got, want)
	}
	// Refuse is the same refusal, for a check made by the store.
	err = c.Refuse("r2", dlock.Fence{Token: 3, Owner: "x"}, 9)
	if !errors.As(err, &st) || *st != (dlock.StaleTokenError{Resource: "r2", Token: 3, Owner: "x", Highest: 9}) {
		t.Fatalf("Refuse = %v", err)
	}
	want = dlock.Event{Kind: dlock.EventRejected, Backend: "test", Key: "r2", Mode: dlock.Exclusive, Token: 3, Owner: "x", Highest: 9}
	if len(got) != 2 || got[1] != want {
		t.Fatalf("events %+v, want a second one %+v", got, want)
	}

	// The zero Checker applies the rule and reports to no one.
	var zero guard.Checker
	if _, err := zero.Check("r", hi, dlock.Fence{Token: 0, Owner: "a"}); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("zero Checker: Check(token 0) = %v", err)
	}
}

// The refusal of token 0 says so, rather than naming another owner.
func TestStaleTokenZeroMessage(t *testing.T) {
	err := guard.NewChecker("test", nil).Refuse("r", dlock.Fence{Owner: "a"}, 0)
	if msg := err.Error(); !strings.Contains(msg, "token 0 is no lock's token") {
		t.Fatalf("message %q", msg)
	}
}
