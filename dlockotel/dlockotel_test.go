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
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// tracing is a TracerProvider exporting to memory, synchronously, and the
// test's own parent span.
type tracing struct {
	tp  *sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter
}

func newTracing(t *testing.T) *tracing {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{tp: tp, exp: exp}
}

// parent starts the caller's span; the test ends it.
func (tr *tracing) parent(t *testing.T) (context.Context, trace.Span) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return tr.tp.Tracer("test").Start(ctx, "caller")
}

// spans returns the ended spans named name, oldest first.
func (tr *tracing) spans(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name, waiting up to 5s for it
// (a hold span ended by a loss is ended on the watchdog's goroutine).
func (tr *tracing) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s := tr.spans(name)
		if len(s) == 1 {
			return s[0]
		}
		if len(s) > 1 || time.Now().After(end) {
			t.Fatalf("%d spans named %s, want 1", len(s), name)
		}
	}
}

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	// Later values win, as in the SDK.
	var v attribute.Value
	found := false
	for _, a := range s.Attributes {
		if a.Key == k {
			v, found = a.Value, true
		}
	}
	return v, found
}

func wantAttr(t *testing.T, s tracetest.SpanStub, k attribute.Key, want any) {
	t.Helper()
	v, ok := attr(s, k)
	if !ok {
		t.Fatalf("%s: no attribute %s (have %v)", s.Name, k, s.Attributes)
	}
	if got := v.AsInterface(); got != want {
		t.Fatalf("%s: %s = %v (%T), want %v (%T)", s.Name, k, got, got, want, want)
	}
}

func eventNames(s tracetest.SpanStub) string {
	var n []string
	for _, e := range s.Events {
		n = append(n, e.Name)
	}
	return strings.Join(n, " ")
}

func eventAttr(t *testing.T, s tracetest.SpanStub, event string, k attribute.Key) attribute.Value {
	t.Helper()
	for _, e := range s.Events {
		if e.Name != event {
			continue
		}
		for _, a := range e.Attributes {
			if a.Key == k {
				return a.Value
			}
		}
	}
	t.Fatalf("%s: no event %s with attribute %s (events %v)", s.Name, event, k, s.Events)
	return attribute.Value{}
}

func TestAcquireAndRelease(t *testing.T) {
	tr := newTracing(t)
	l := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)

	lk, err := l.Acquire(ctx, "invoice:42", dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	acq := tr.one(t, dlockotel.SpanAcquire)
	if acq.Parent.SpanID() != caller.SpanContext().SpanID() || acq.SpanContext.TraceID() != caller.SpanContext().TraceID() {
		t.Fatalf("acquire span's parent %v, want the caller's span %v", acq.Parent, caller.SpanContext())
	}
	wantAttr(t, acq, dlockotel.AttrOperation, "acquire")
	wantAttr(t, acq, dlockotel.AttrResult, "acquired")
	wantAttr(t, acq, dlockotel.AttrBackend, "memory")
	wantAttr(t, acq, dlockotel.AttrMode, "exclusive")
	wantAttr(t, acq, dlockotel.AttrKeyClass, dlockotel.DefaultKeyClass)
	wantAttr(t, acq, dlockotel.AttrAttempts, int64(1))
	wantAttr(t, acq, dlockotel.AttrToken, int64(lk.Token()))
	wantAttr(t, acq, dlockotel.AttrOwner, lk.Owner())
	if v, ok := attr(acq, dlockotel.AttrWaitMS); !ok || v.AsFloat64() < 0 {
		t.Fatalf("wait_ms %v", v)
	}
	if acq.Status.Code != codes.Unset {
		t.Fatalf("acquire status %v", acq.Status)
	}
	if len(tr.spans(dlockotel.SpanHold)) != 0 {
		t.Fatal("hold span ended while the lock is held")
	}

	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	caller.End()
	hold := tr.one(t, dlockotel.SpanHold)
	if hold.Parent.SpanID() != caller.SpanContext().SpanID() {
		t.Fatalf("hold span's parent %v, want the caller's span", hold.Parent)
	}
	if len(hold.Links) != 1 || hold.Links[0].SpanContext.SpanID() != acq.SpanContext.SpanID() {
		t.Fatalf("hold span links %v, want the acquire span", hold.Links)
	}
	if hold.StartTime.Before(acq.StartTime) || !hold.StartTime.Equal(acq.EndTime) {
		t.Fatalf("hold starts at %v; the acquire span runs %v..%v", hold.StartTime, acq.StartTime, acq.EndTime)
	}
	if got := eventNames(hold); got != dlockotel.EventReleased {
		t.Fatalf("hold events %q", got)
	}
	wantAttr(t, hold, dlockotel.AttrEnd, "released")
	wantAttr(t, hold, dlockotel.AttrRenewals, int64(2))
	wantAttr(t, hold, dlockotel.AttrToken, int64(lk.Token()))
	wantAttr(t, hold, dlockotel.AttrBackend, "memory")
	if hold.Status.Code != codes.Unset {
		t.Fatalf("hold status %v", hold.Status)
	}
	if v, ok := attr(hold, dlockotel.AttrHeldMS); !ok || v.AsFloat64() <= 0 {
		t.Fatalf("held_ms %v", v)
	}
}

func TestContentionThenAcquire(t *testing.T) {
	tr := newTracing(t)
	var rec dlocktest.Recorder
	ml := memlock.New(dlock.WithObserver(&rec))
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()

	holder, err := ml.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	rec.Take()
	type res struct {
		lk  *dlock.Lock
		err error
	}
	done := make(chan res, 1)
	go func() {
		lk, err := l.Acquire(ctx, "k")
		done <- res{lk, err}
	}()
	// Release the holder once the waiter's first attempt was refused, so
	// that it needs another: its second attempt is sent only after the
	// first was answered.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if e, ok := rec.Last(dlock.EventAttempt); ok && e.Attempts >= 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the waiter made no second attempt")
		}
	}
	time.Sleep(10 * time.Millisecond) // the waiter waits at least this much more
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lk.Release(ctx)
	acq := tr.one(t, dlockotel.SpanAcquire)
	wantAttr(t, acq, dlockotel.AttrResult, "acquired")
	if v, _ := attr(acq, dlockotel.AttrAttempts); v.AsInt64() < 2 {
		t.Fatalf("attempts %d, want at least 2", v.AsInt64())
	}
	if v, _ := attr(acq, dlockotel.AttrWaitMS); v.AsFloat64() < 10 {
		t.Fatalf("wait_ms %v, want at least the 10ms the holder kept the key", v.AsFloat64())
	}
	if acq.Status.Code != codes.Unset {
		t.Fatalf("status %v", acq.Status)
	}
}

func TestTryAcquireHeldKeyIsNotAnError(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	holder, err := ml.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	acq := tr.one(t, dlockotel.SpanAcquire)
	wantAttr(t, acq, dlockotel.AttrOperation, "try_acquire")
	wantAttr(t, acq, dlockotel.AttrResult, "contended")
	wantAttr(t, acq, dlockotel.AttrAttempts, int64(1))
	if acq.Status.Code != codes.Unset {
		t.Fatalf("a contended TryAcquire has status %v, want Unset", acq.Status)
	}
	if _, ok := attr(acq, dlockotel.AttrToken); ok {
		t.Fatal("token on a failed acquisition")
	}
	if n := len(tr.spans(dlockotel.SpanHold)); n != 0 {
		t.Fatalf("%d hold spans for a failed acquisition", n)
	}
}

func TestAcquireTimeoutIsAnError(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	holder, err := ml.TryAcquire(ctx, "secret-customer-7")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := l.Acquire(ctx, "secret-customer-7", dlock.WithWait(30*time.Millisecond)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	acq := tr.one(t, dlockotel.SpanAcquire)
	wantAttr(t, acq, dlockotel.AttrResult, "timeout")
	wantAttr(t, acq, dlockotel.AttrErrorType, "not_acquired")
	if acq.Status.Code != codes.Error || acq.Status.Description != "dlock: lock not acquired: context deadline exceeded" {
		t.Fatalf("status %+v", acq.Status)
	}
	if v, _ := attr(acq, dlockotel.AttrWaitMS); v.AsFloat64() < 30 {
		t.Fatalf("wait_ms %v, want at least WithWait's 30ms", v.AsFloat64())
	}
	noKey(t, tr, "secret-customer-7")
}

// noKey fails if key appears anywhere in the exported spans.
func noKey(t *testing.T, tr *tracing, key string) {
	t.Helper()
	for _, s := range tr.exp.GetSpans() {
		all := append([]attribute.KeyValue(nil), s.Attributes...)
		for _, e := range s.Events {
			all = append(all, e.Attributes...)
		}
		for _, a := range all {
			if strings.Contains(a.Value.Emit(), key) {
				t.Fatalf("%s: attribute %s=%q names the key", s.Name, a.Key, a.Value.Emit())
			}
		}
		if strings.Contains(s.Status.Description, key) {
			t.Fatalf("%s: status %q names the key", s.Name, s.Status.Description)
		}
	}
}

func TestLossEndsTheHoldSpan(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	// Auto-refresh on: the watchdog's renewal is refused and loses the
	// lock, on its own goroutine.
	lk, err := l.Acquire(ctx, "secret-42", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ml.Expire("secret-42")
	select {
	case <-lk.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("not lost after the lease was deleted")
	}
	hold := tr.one(t, dlockotel.SpanHold)
	if got, want := eventNames(hold), "renew_failed lock_lost"; got != want {
		t.Fatalf("hold events %q, want %q", got, want)
	}
	if v := eventAttr(t, hold, dlockotel.EventRenewFailed, dlockotel.AttrResult); v.AsString() != "refused" {
		t.Fatalf("renew_failed result %q", v.AsString())
	}
	if v := eventAttr(t, hold, dlockotel.EventLockLost, dlockotel.AttrLossReason); v.AsString() != "not_held" {
		t.Fatalf("lock_lost reason %q", v.AsString())
	}
	wantAttr(t, hold, dlockotel.AttrEnd, "lost")
	wantAttr(t, hold, dlockotel.AttrLossReason, "not_held")
	if hold.Status.Code != codes.Error || hold.Status.Description != "dlock: lock lost: not_held" {
		t.Fatalf("hold status %+v", hold.Status)
	}
	// The release that follows a loss reports the loss, and adds nothing
	// to the ended span.
	if err := lk.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatal(err)
	}
	if n := len(tr.spans(dlockotel.SpanHold)); n != 1 {
		t.Fatalf("%d hold spans", n)
	}
	noKey(t, tr, "secret-42")
}

func TestLossByDeadlineOnManualRefresh(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	lk, err := l.Acquire(ctx, "k", dlock.WithTTL(200*time.Millisecond), dlock.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	<-lk.Lost() // the local deadline passes: nobody renewed
	hold := tr.one(t, dlockotel.SpanHold)
	if got := eventNames(hold); got != "lock_lost" {
		t.Fatalf("hold events %q", got)
	}
	wantAttr(t, hold, dlockotel.AttrLossReason, "deadline")
	wantAttr(t, hold, dlockotel.AttrRenewals, int64(0))
}

func TestKeyClassAndRawKey(t *testing.T) {
	tr := newTracing(t)
	class := func(key string) string {
		if key == "boom" {
			panic("class bug")
		}
		p, _, _ := strings.Cut(key, ":")
		return p
	}
	ml := memlock.New()
	l := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr.tp), dlockotel.WithKeyClass(class))
	ctx, caller := tr.parent(t)
	defer caller.End()
	for _, key := range []string{"invoice:1", "boom"} {
		lk, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	hold := tr.spans(dlockotel.SpanHold)
	if len(hold) != 2 {
		t.Fatalf("%d hold spans", len(hold))
	}
	wantAttr(t, hold[0], dlockotel.AttrKeyClass, "invoice")
	wantAttr(t, hold[1], dlockotel.AttrKeyClass, dlockotel.UnknownKeyClass)
	if _, ok := attr(hold[0], dlockotel.AttrKey); ok {
		t.Fatal("raw key recorded without WithRawKey")
	}
	noKey(t, tr, "invoice:1")

	tr2 := newTracing(t)
	raw := dlockotel.Wrap(ml, dlockotel.WithTracerProvider(tr2.tp), dlockotel.WithRawKey())
	holder, err := ml.TryAcquire(ctx, "invoice:2")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := raw.Acquire(ctx, "invoice:2", dlock.WithWait(20*time.Millisecond)); err == nil {
		t.Fatal("acquired a held key")
	}
	acq := tr2.one(t, dlockotel.SpanAcquire)
	wantAttr(t, acq, dlockotel.AttrKey, "invoice:2")
	wantAttr(t, acq, dlockotel.AttrKeyClass, dlockotel.DefaultKeyClass)
	if !strings.Contains(acq.Status.Description, `"invoice:2"`) {
		t.Fatalf("WithRawKey: status %q lacks the full error", acq.Status.Description)
	}
}

func TestBadInput(t *testing.T) {
	tr := newTracing(t)
	ctx, caller := tr.parent(t)
	defer caller.End()
	var nilMem *memlock.Locker
	for name, l := range map[string]dlock.Locker{
		"nil":       dlockotel.Wrap(nil, dlockotel.WithTracerProvider(tr.tp)),
		"typed nil": dlockotel.Wrap(nilMem, dlockotel.WithTracerProvider(tr.tp)),
	} {
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) || !strings.HasPrefix(err.Error(), "dlock: ") {
			t.Fatalf("%s: Acquire: %v", name, err)
		}
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
			t.Fatalf("%s: TryAcquire: %v", name, err)
		}
		if u, ok := l.(interface{ Unwrap() dlock.Locker }); !ok || u.Unwrap() != nil {
			t.Fatalf("%s: Unwrap", name)
		}
		if _, ok := l.(dlock.Lister); ok {
			t.Fatalf("%s: a nil Locker wrapped claims to list", name)
		}
	}
	l := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(tr.tp), nil)
	var nilCtx context.Context
	if _, err := l.Acquire(nilCtx, "k"); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("nil context: %v", err)
	}
	if _, err := l.TryAcquire(ctx, ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	acq := tr.one(t, dlockotel.SpanAcquire) // none for the nil context
	wantAttr(t, acq, dlockotel.AttrResult, "error")
	wantAttr(t, acq, dlockotel.AttrErrorType, "invalid_key")
	if acq.Status.Code != codes.Error || acq.Status.Description != "dlock: invalid key" {
		t.Fatalf("status %+v", acq.Status)
	}
}

// plainLocker hides every method but Acquire and TryAcquire.
type plainLocker struct{ l dlock.Locker }

func (p plainLocker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return p.l.Acquire(ctx, key, opts...)
}

func (p plainLocker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return p.l.TryAcquire(ctx, key, opts...)
}

// silentLocker drops the call's options: a Locker that reports no Events.
type silentLocker struct{ l dlock.Locker }

func (s silentLocker) Acquire(ctx context.Context, key string, _ ...dlock.Option) (*dlock.Lock, error) {
	return s.l.Acquire(ctx, key)
}

func (s silentLocker) TryAcquire(ctx context.Context, key string, _ ...dlock.Option) (*dlock.Lock, error) {
	return s.l.TryAcquire(ctx, key)
}

func TestListerPassthroughAndUnwrap(t *testing.T) {
	ctx := context.Background()
	ml := memlock.New()
	l := dlockotel.Wrap(ml)
	ls, ok := l.(dlock.Lister)
	if !ok {
		t.Fatal("a wrapped memlock does not list")
	}
	lk, err := l.TryAcquire(ctx, "jobs/a")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	infos, err := ls.List(ctx, "jobs/")
	if err != nil || len(infos) != 1 || infos[0].Key != "jobs/a" {
		t.Fatal(infos, err)
	}
	if u := l.(interface{ Unwrap() dlock.Locker }).Unwrap(); u != ml {
		t.Fatal("Unwrap does not return the wrapped Locker")
	}
	if _, ok := dlockotel.Wrap(plainLocker{ml}).(dlock.Lister); ok {
		t.Fatal("a wrapped non-Lister claims to list")
	}
}

func TestLockerWithoutEvents(t *testing.T) {
	tr := newTracing(t)
	ml := memlock.New()
	l := dlockotel.Wrap(silentLocker{ml}, dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	acq := tr.spans(dlockotel.SpanAcquire)
	if len(acq) != 2 {
		t.Fatalf("%d acquire spans", len(acq))
	}
	wantAttr(t, acq[0], dlockotel.AttrResult, "acquired")
	wantAttr(t, acq[0], dlockotel.AttrToken, int64(lk.Token()))
	wantAttr(t, acq[1], dlockotel.AttrResult, "contended")
	if n := len(tr.spans(dlockotel.SpanHold)); n != 0 {
		t.Fatalf("%d hold spans without Events", n)
	}
}

func TestHelpersAreTraced(t *testing.T) {
	tr := newTracing(t)
	l := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	err := dlock.Do(ctx, l, "k", func(ctx context.Context, lk *dlock.Lock) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	ran, err := dlock.RunOnce(ctx, l, "job", time.Second, 0, func(context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatal(ran, err)
	}
	set, err := dlock.AcquireAll(ctx, l, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); len(tr.spans(dlockotel.SpanHold)) < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d hold spans, want 4 (Do, RunOnce, AcquireAll's two)", len(tr.spans(dlockotel.SpanHold)))
		}
	}
	if n := len(tr.spans(dlockotel.SpanAcquire)); n != 4 {
		t.Fatalf("%d acquire spans, want 4", n)
	}
	for _, s := range tr.exp.GetSpans() {
		if s.Name != "caller" && s.Parent.SpanID() != caller.SpanContext().SpanID() {
			t.Fatalf("%s: parent %v, want the caller's span", s.Name, s.Parent)
		}
	}
}

// panicTracer's spans cannot even be started.
type panicProvider struct{ noop.TracerProvider }

func (panicProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return panicTracer{} }

type panicTracer struct{ noop.Tracer }

func (panicTracer) Start(context.Context, string, ...trace.SpanStartOption) (context.Context, trace.Span) {
	panic("tracer bug")
}

func TestPanickingTracerBreaksNothing(t *testing.T) {
	l := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(panicProvider{}))
	ctx := context.Background()
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	tr := newTracing(t)
	l := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(tr.tp))
	ctx, caller := tr.parent(t)
	defer caller.End()
	const n = 8
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			err := dlock.Do(ctx, l, "shared", func(context.Context, *dlock.Lock) error { return nil })
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := len(tr.spans(dlockotel.SpanHold)); got != n {
		t.Fatalf("%d hold spans, want %d", got, n)
	}
	tokens := map[int64]bool{}
	for _, s := range tr.spans(dlockotel.SpanHold) {
		v, _ := attr(s, dlockotel.AttrToken)
		if tokens[v.AsInt64()] {
			t.Fatalf("token %d held twice", v.AsInt64())
		}
		tokens[v.AsInt64()] = true
	}
}

// Symptom: Wrap hid the wrapped Locker's Breaker, so dlock.Break on a traced Locker failed with ErrUnsupported.
func TestWrap_PassesBreakerThrough(t *testing.T) {
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
// tracer must not break the call (a nil context would fail Acquire).
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

// Symptom: a TracerProvider that panicked or returned a nil context or span broke Wrap or Acquire.
func TestWrap_SurvivesBrokenTracerProviders(t *testing.T) {
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

// Guards against: error text naming the key or the holders' metadata reaching a span.
// Errors name the key and the holders' metadata (host names): without
// WithRawKey none of it may reach a span, its status or its events.
func TestSpans_CarryNoKeyOrMetadataWithoutRawKey(t *testing.T) {
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

// Guards against: a hold span ending twice, or never, when Release races the loss.
// Concurrent calls whose Locks are released while they are being lost:
// every hold span ends once, with exactly one of lock_lost and released,
// child of the caller's span; every acquire span ends too.
func TestHoldSpan_EndsOnceWhenReleaseRacesLoss(t *testing.T) {
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
