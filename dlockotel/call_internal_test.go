package dlockotel

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A Lock can be lost on the watchdog's goroutine between being granted
// and its EventAcquire: the hold span must still start and end, once.
// The order is too rare to provoke through a backend, so the Events are
// fed to the call's Observer as dlock would report them.
func TestLossBeforeAcquireEvent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	w := Wrap(nil, WithTracerProvider(tp)).(*locker)

	for _, tc := range []struct {
		name     string
		early    dlock.Event
		wantHold int
	}{
		{"same lock", dlock.Event{Kind: dlock.EventLost, Token: 7, Owner: "o", Reason: dlock.LossDeadline}, 1},
		// A lock lost while it was handed out, then another attempt got
		// a new one: the early loss is not the acquired lock's.
		{"earlier grant", dlock.Event{Kind: dlock.EventLost, Token: 6, Owner: "x", Reason: dlock.LossBackend}, 0},
	} {
		exp.Reset()
		c := &call{w: w, keyClass: DefaultKeyClass}
		start := time.Now()
		_, c.span = w.start(context.Background(), start, nil)
		c.Observe(dlock.Event{Kind: dlock.EventWait})
		c.Observe(tc.early)
		c.Observe(dlock.Event{Kind: dlock.EventAcquire, Result: dlock.ResultAcquired, Token: 7, Owner: "o", Attempts: 1})
		c.endAcquire(context.Background(), start, nil, nil, true)
		var hold []tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.Name == SpanHold {
				hold = append(hold, s)
			}
		}
		if len(hold) != tc.wantHold {
			t.Fatalf("%s: %d hold spans ended, want %d", tc.name, len(hold), tc.wantHold)
		}
		if tc.wantHold == 1 && (len(hold[0].Events) != 1 || hold[0].Events[0].Name != EventLockLost) {
			t.Fatalf("%s: hold events %v", tc.name, hold[0].Events)
		}
		// A later release of the same lock adds nothing (dlock reports
		// only the first of loss and release; the span is ended once).
		c.Observe(dlock.Event{Kind: dlock.EventRelease, Token: 7, Owner: "o"})
		n := 0
		for _, s := range exp.GetSpans() {
			if s.Name == SpanHold {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%s: %d hold spans after the release, want 1", tc.name, n)
		}
	}
}
