package redlock_test

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock/redlock"
)

// QuorumError names what happened on each node.
func TestQuorumErrorText(t *testing.T) {
	qe := &redlock.QuorumError{Op: "commit", Key: "k", Quorum: 2, Results: []redlock.NodeResult{
		{Node: "a", Outcome: redlock.OutcomeGranted},
		{Node: "b", Outcome: redlock.OutcomeGone},
		{Node: "c", Outcome: redlock.OutcomeNoAnswer, Err: errors.New("no answer within 50ms")},
	}}
	want := `dlock: redlock commit "k": 1/3 nodes confirmed, need 2; b: lease gone; c: no answer within 50ms`
	if got := qe.Error(); got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// A node whose key is reserved for a woken waiter is reported as such,
// not as "held by unknown holder".
// Symptom: a reserved node read "held by unknown holder".
func TestQuorumErrorNamesReservation(t *testing.T) {
	qe := &redlock.QuorumError{Op: "acquire", Key: "k", Quorum: 2, Results: []redlock.NodeResult{
		{Node: "a", Outcome: redlock.OutcomeHeld, Metadata: map[string]string{redlock.MetaReservedForWaiter: "w1"}},
		{Node: "b", Outcome: redlock.OutcomeHeld, Holder: "0123456789abcdef"},
		{Node: "c", Outcome: redlock.OutcomeGranted},
	}}
	want := `dlock: redlock acquire "k": 1/3 nodes granted, need 2; a: reserved for waiter w1; b: held by owner 0123456789ab`
	if got := qe.Error(); got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
