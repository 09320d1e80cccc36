package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// A --shared run refused while only readers hold the key is refused for a
// waiting writer (writer preference): the message says so.
func TestHeldTextWaitingWriter(t *testing.T) {
	t.Parallel()
	na := &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{
		{Owner: "0123456789abcdef", Mode: dlock.Shared, TTL: time.Second},
		{Owner: "fedcba9876543210", Mode: dlock.Shared, TTL: time.Second},
	}}
	got := heldText(acquireRequest{key: "k", mode: dlock.Shared}, na)
	if !strings.Contains(got, `lock "k" is held shared by owner 0123456789ab`) || !strings.Contains(got, "an exclusive run is waiting") {
		t.Errorf("heldText: %q", got)
	}
	// Holders that were not seen say nothing about the mode.
	if got := heldText(acquireRequest{key: "k"}, &dlock.NotAcquiredError{Key: "k"}); got != `lock "k" is held` {
		t.Errorf("heldText without holders: %q", got)
	}
	// A reservation (a lease without an owner) says nothing about modes.
	reserved := &dlock.NotAcquiredError{Key: "k", Holders: []dlock.Holder{{TTL: time.Second}}}
	if got := heldText(acquireRequest{key: "k", mode: dlock.Limited, limit: 2}, reserved); got != `lock "k" is held, lease ends in 1s` {
		t.Errorf("heldText, a permit against a reservation: %q", got)
	}
	// A shared request refused with nobody named: a waiting writer whose
	// readers are gone.
	if got := heldText(acquireRequest{key: "k", mode: dlock.Shared}, &dlock.NotAcquiredError{Key: "k"}); !strings.Contains(got, "or an exclusive run is waiting") {
		t.Errorf("heldText, shared, without holders: %q", got)
	}
}
