package etcdlock

import (
	"context"
	"errors"
	"testing"
)

// A loaded process whose probes etcd answered, but which sent them more
// than waitRecency apart, reported etcd unavailable instead of the holder.
func TestEnded_AnsweredWaitReportsTheHolderHoweverSparseItsProbes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &waiter{e: &entry{key: "k"}}
	if err := w.ended(ctx, nil); err != errWaitEnded {
		t.Fatalf("ended with every request answered = %v, want the holder (errWaitEnded)", err)
	}
	w.ask()
	w.answered()
	if err := w.ended(ctx, nil); err != errWaitEnded {
		t.Fatalf("ended after an answer = %v, want the holder (errWaitEnded)", err)
	}
}

// A request left unanswered for waitRecency when the context ends is an
// outage, whatever was answered before it.
func TestEnded_RequestUnansweredForWaitRecencyIsNoAnswer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &waiter{e: &entry{key: "k"}}
	w.ask()
	w.asked = w.asked.Add(-waitRecency)
	w.ask() // a later request does not move the oldest unanswered one
	err := w.ended(ctx, context.Canceled)
	if err == errWaitEnded || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended with a request out for %v = %v, want no answer wrapping the request's error", waitRecency, err)
	}
	w.answered()
	if err := w.ended(ctx, nil); err != errWaitEnded {
		t.Fatalf("ended once answered = %v, want the holder (errWaitEnded)", err)
	}
}
