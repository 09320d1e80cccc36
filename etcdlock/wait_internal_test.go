package etcdlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A loaded process whose probes etcd answered, but which sent them more
// than waitRecency apart, reported etcd unavailable instead of the holder.
func TestEnded_WaitBetweenAnsweredRequestsReportsTheHolder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &waiter{e: &entry{key: "k"}, answerAt: time.Now().Add(-10 * waitRecency)}
	if err := w.ended(ctx, nil); err != errWaitEnded {
		t.Fatalf("ended between requests, the last answered long ago = %v, want the holder (errWaitEnded)", err)
	}
	w.ask()
	w.answered()
	if err := w.ended(ctx, nil); err != errWaitEnded {
		t.Fatalf("ended after an answer = %v, want the holder (errWaitEnded)", err)
	}
}

// A request out when the context ends, with nothing answered for
// waitRecency, is an outage; with an answer more recent, it is not.
func TestEnded_RequestOutAfterSilenceIsNoAnswer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &waiter{e: &entry{key: "k"}, answerAt: time.Now()}
	w.ask()
	w.outAt = w.outAt.Add(-waitProbe)
	if err := w.ended(ctx, context.Canceled); err != errWaitEnded {
		t.Fatalf("ended with a request out, etcd answering just before = %v, want the holder (errWaitEnded)", err)
	}
	w.answerAt = w.answerAt.Add(-waitRecency)
	err := w.ended(ctx, context.Canceled)
	if err == errWaitEnded || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended with a request out after %v of silence = %v, want no answer wrapping the request's error", waitRecency, err)
	}
}

// A loaded process that woke past its deadline and sent a probe then
// reported etcd silent since its last answer, though etcd answered every
// request.
func TestEnded_ProbeSentAtTheEndIsNotSilence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &waiter{e: &entry{key: "k"}, answerAt: time.Now().Add(-10 * waitRecency)}
	w.ask() // sent now, failing at once on the ended context
	if err := w.ended(ctx, context.Canceled); err != errWaitEnded {
		t.Fatalf("ended with a probe sent just now = %v, want the holder (errWaitEnded)", err)
	}
}
