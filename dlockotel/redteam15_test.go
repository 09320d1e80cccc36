package dlockotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/memlock"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Red team (issue 15): Wrap hid the wrapped Locker's Breaker, so
// dlock.Break on a traced Locker failed with ErrUnsupported.
func TestRedTeam15_BreakThroughWrap(t *testing.T) {
	ctx := context.Background()
	ml := memlock.New()
	l := dlockotel.Wrap(ml)
	if _, ok := l.(dlock.Lister); !ok {
		t.Fatal("a wrapped memlock does not list")
	}
	lk, err := l.TryAcquire(ctx, "jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := dlock.Break(ctx, l, "jobs/a", "")
	if err != nil {
		t.Fatalf("Break through Wrap: %v", err)
	}
	if len(b.Holders) != 1 || b.Holders[0].Owner != lk.Owner() {
		t.Fatalf("Break removed %+v, want the holder %s", b.Holders, lk.Owner())
	}
	_ = lk.Release(ctx)

	// A Breaker that is no Lister, and neither.
	if _, ok := dlockotel.Wrap(breakOnly{ml}).(dlock.Breaker); !ok {
		t.Fatal("a wrapped Breaker does not break")
	}
	if _, ok := dlockotel.Wrap(breakOnly{ml}).(dlock.Lister); ok {
		t.Fatal("a wrapped non-Lister claims to list")
	}
	if _, err := dlock.Break(ctx, dlockotel.Wrap(plainLocker{ml}), "k", ""); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Break through a wrapped non-Breaker: %v, want ErrUnsupported", err)
	}
	if _, err := dlock.Break(ctx, dlockotel.Wrap(nil), "k", ""); err == nil {
		t.Fatal("Break through Wrap(nil) succeeded")
	}
}

type breakOnly struct{ ml *memlock.Locker }

func (b breakOnly) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return b.ml.Acquire(ctx, key, opts...)
}

func (b breakOnly) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return b.ml.TryAcquire(ctx, key, opts...)
}

func (b breakOnly) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return b.ml.Break(ctx, key, owner)
}

// nilProvider's tracer returns a nil context and a nil span: a broken
// tracer must not break the call (a nil context made Acquire fail).
type nilProvider struct{ noop.TracerProvider }

func (nilProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return nilTracer{} }

type nilTracer struct{ noop.Tracer }

func (nilTracer) Start(context.Context, string, ...trace.SpanStartOption) (context.Context, trace.Span) {
	return nil, nil //nolint:staticcheck // the point of the test
}

// tracerPanics panics when asked for its tracer, at Wrap.
type tracerPanics struct{ noop.TracerProvider }

func (tracerPanics) Tracer(string, ...trace.TracerOption) trace.Tracer { panic("provider bug") }

// nilTracerProvider returns a nil Tracer.
type nilTracerProvider struct{ noop.TracerProvider }

func (nilTracerProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return nil }

func TestRedTeam15_BrokenTracerProviders(t *testing.T) {
	for name, tp := range map[string]trace.TracerProvider{
		"nil span and context": nilProvider{},
		"Tracer panics":        tracerPanics{},
		"nil Tracer":           nilTracerProvider{},
	} {
		t.Run(name, func(t *testing.T) {
			ml := memlock.New()
			var l dlock.Locker
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("Wrap panicked: %v", p)
					}
				}()
				l = dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tp))
			}()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			lk, err := l.Acquire(ctx, "k")
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("TryAcquire of a held key: %v", err)
			}
			if err := lk.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lk, err = l.Acquire(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			ml.Expire("k")
			if err := lk.Refresh(ctx); !errors.Is(err, dlock.ErrLockLost) {
				t.Fatalf("Refresh of an expired lock: %v", err)
			}
		})
	}
}

// Errors name the key and the holders' metadata (host names): without
// WithRawKey none of it may reach a span, its status or its events.
func TestRedTeam15_NoKeyInSpans(t *testing.T) {
	tr := newTracing(t)
	const secret = "customer-4711-secret"
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	meta := dlock.WithMetadata("host", "host-"+secret)
	holder, err := l.Acquire(ctx, "k/"+secret, meta)
	if err != nil {
		t.Fatal(err)
	}
	// Contended, timed out, invalid, unsupported mode, limit mismatch.
	_, _ = l.TryAcquire(ctx, "k/"+secret, meta)
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _ = l.Acquire(wctx, "k/"+secret, meta)
	cancel()
	_, _ = l.Acquire(ctx, "bad\x00"+secret)
	_, _ = l.Acquire(ctx, strings.Repeat(secret, 1000))
	sh, err := l.Acquire(ctx, "s/"+secret, dlock.WithLimit(2))
	if err == nil {
		_, _ = l.TryAcquire(ctx, "s/"+secret, dlock.WithLimit(3))
		_ = sh.Release(ctx)
	}
	// Lost, with the loss error naming the key.
	ml.Expire("k/" + secret)
	_ = holder.Refresh(ctx)
	_ = holder.Release(ctx)
	caller.End()
	for end := time.Now().Add(5 * time.Second); len(tr.spans(dlockotel.SpanHold)) < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no hold span ended")
		}
	}
	for _, s := range tr.exp.GetSpans() {
		check := func(where, text string) {
			if strings.Contains(text, secret) {
				t.Errorf("%s %s: the key or metadata leaked: %.200s", s.Name, where, text)
			}
		}
		check("status", s.Status.Description)
		for _, a := range s.Attributes {
			check("attribute "+string(a.Key), a.Value.Emit())
		}
		for _, e := range s.Events {
			for _, a := range e.Attributes {
				check("event "+e.Name+" "+string(a.Key), a.Value.Emit())
			}
		}
	}
}

// Attack that held: concurrent calls whose Locks are released while they
// are being lost: every hold span ends once, with exactly one of
// lock_lost and released, child of the caller's span; every acquire span
// ends too.
func TestRedTeam15_ReleaseRacesLoss(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", i%3)
			lk, err := l.Acquire(ctx, key, dlock.WithTTL(dlock.MinTTL))
			if err != nil {
				t.Error(err)
				return
			}
			var in sync.WaitGroup
			in.Go(func() { ml.Expire(key) })
			in.Go(func() { _ = lk.Release(ctx) })
			in.Wait()
		})
	}
	wg.Wait()
	for end := time.Now().Add(5 * time.Second); len(tr.spans(dlockotel.SpanHold)) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d hold spans ended, want %d", len(tr.spans(dlockotel.SpanHold)), n)
		}
	}
	time.Sleep(20 * time.Millisecond) // a second end would show up now
	hold := tr.spans(dlockotel.SpanHold)
	if len(hold) != n {
		t.Fatalf("%d hold spans, want %d", len(hold), n)
	}
	for _, s := range hold {
		if ev := eventNames(s); ev != dlockotel.EventLockLost && ev != dlockotel.EventReleased {
			t.Errorf("hold span events %q, want one of lock_lost and released", ev)
		}
		if s.Parent.SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("hold span parent %v, want the caller's", s.Parent)
		}
	}
	if got := len(tr.spans(dlockotel.SpanAcquire)); got != n {
		t.Fatalf("%d acquire spans, want %d", got, n)
	}
}
