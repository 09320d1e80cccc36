// Package guardtest is the conformance suite every guard runs: the
// admission rule of package guard (dlock.FenceRecord.Admit) through Put, Get and,
// for a guard.Doer, Do; shared fences; fenced reads; values and names;
// independence of resources (one being a prefix of another, odd bytes,
// dlock.MaxKeyLen-byte names); concurrent callers; a second guard
// instance on the same store; bad input; and the EventRejected reports.
//
//	func TestGuard(t *testing.T) {
//		guardtest.Run(t, func(t *testing.T, opts ...driver.Option) guard.Guard {
//			return guard.NewMemory(opts...)
//		})
//	}
//
// Resources are unique to each test (see Resource), so a store that keeps
// its data between tests and runs (a Redis or etcd server) needs no
// cleaning. Every wait is bounded by dlocktest.HangTimeout. The suite's
// tests do not call t.Parallel, and the ones that start goroutines check
// with goleak that none is left behind: run them apart from tests that
// start goroutines of their own concurrently.
package guardtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/memlock"
)

// NewFunc returns a guard on the store under test, built with opts: the
// suite passes dlock.WithObserver (and nil options) among them, so they
// must reach the guard's constructor. Guards from separate calls may share
// a store or not; Shared says how to get one that does.
type NewFunc func(t *testing.T, opts ...driver.Option) guard.Guard

// Option configures Run.
type Option func(*config)

type config struct {
	other    func(t *testing.T, g guard.Guard, opts ...driver.Option) guard.Guard
	leakOpts []goleak.Option
	stalled  func(t *testing.T) (guard.Guard, func())
}

// Stallable says how to get a guard whose link to its store can hang:
// stalled returns a new guard and a function that stalls its link for
// good (a server or network that stops answering without closing the
// connection). The suite then checks that every call on the stalled link
// returns by its context's deadline with an error wrapping
// dlock.ErrUnavailable and the context's error. Guards whose store is
// local (Memory, filelock.Guard) have no link to stall.
func Stallable(stalled func(t *testing.T) (g guard.Guard, stall func())) Option {
	return func(c *config) { c.stalled = stalled }
}

// Shared says the guard keeps its state in a store that other guard
// instances share (another process, or the same one after a restart):
// other returns a new guard, built with opts, on the store of g, as a
// separate process would open it (its own client or connection). The suite
// then checks that such instances see each other's fences and values and
// exclude each other, and runs its concurrency checks across two of them.
func Shared(other func(t *testing.T, g guard.Guard, opts ...driver.Option) guard.Guard) Option {
	return func(c *config) { c.other = other }
}

// LeakOptions are passed to goleak.VerifyNone where the suite checks that
// its goroutines left nothing behind, for goroutines a guard's client
// starts on its own (a connection pool's reaper, a gRPC balancer).
func LeakOptions(opts ...goleak.Option) Option {
	return func(c *config) { c.leakOpts = append(c.leakOpts, opts...) }
}

// Run runs the suite against the guards newGuard returns.
func Run(t *testing.T, newGuard NewFunc, opts ...Option) {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	s := &suite{new: newGuard, cfg: c}
	t.Run("Admission", s.testAdmission)
	t.Run("SharedFences", s.testSharedFences)
	t.Run("PausedWriter", s.testPausedWriter)
	t.Run("FencedRead", s.testFencedRead)
	t.Run("Values", s.testValues)
	t.Run("Independent", s.testIndependent)
	t.Run("BadInput", s.testBadInput)
	t.Run("Observer", s.testObserver)
	t.Run("Concurrent", s.testConcurrent)
	t.Run("Do", s.testDo)
	t.Run("SecondInstance", s.testSecondInstance)
	t.Run("StalledStore", s.testStalledStore)
}

type suite struct {
	new NewFunc
	cfg config
}

var seq atomic.Int64

// Resource returns a resource name unique to this run ending in suffix:
// "guardtest.<unix nanos>.<n>/<suffix>".
func Resource(suffix string) string {
	return fmt.Sprintf("guardtest.%d.%d/%s", time.Now().UnixNano(), seq.Add(1), suffix)
}

func ctxT(t *testing.T) context.Context { return dlocktest.Context(t) }

// protect turns a panic in fn into an error.
func protect(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("PANIC: %v", r)
		}
	}()
	return fn()
}

// op is one fenced operation, run through Put, Get or Do.
type op struct {
	name string
	// run does the operation; admitted reports whether it took effect
	// (Do: fn ran), so that a refusal that still ran fn is caught.
	run func(ctx context.Context, g guard.Guard, res string, f dlock.Fence) (admitted bool, err error)
}

var opPut = op{"Put", func(ctx context.Context, g guard.Guard, res string, f dlock.Fence) (bool, error) {
	err := g.Put(ctx, res, f, "n", fenceValue(f))
	return err == nil, err
}}

var opGet = op{"Get", func(ctx context.Context, g guard.Guard, res string, f dlock.Fence) (bool, error) {
	_, _, err := g.Get(ctx, res, f, "n")
	return err == nil, err
}}

var opDo = op{"Do", func(ctx context.Context, g guard.Guard, res string, f dlock.Fence) (bool, error) {
	ran := false
	err := g.(guard.Doer).Do(ctx, res, f, func(context.Context) error { ran = true; return nil })
	if ran && err != nil {
		return true, fmt.Errorf("fn ran but Do returned %w", err)
	}
	return ran, err
}}

func fenceValue(f dlock.Fence) string {
	return fmt.Sprintf("%d|%s|%v", f.Token, f.Owner, f.Shared)
}

// ops are the operations g offers.
func ops(g guard.Guard) []op {
	if _, ok := g.(guard.Doer); ok {
		return []op{opPut, opGet, opDo}
	}
	return []op{opPut, opGet}
}

// checkStale checks that err is the refusal of f for res with the given
// highest token.
func checkStale(t *testing.T, what string, err error, res string, f dlock.Fence, highest uint64) {
	t.Helper()
	var st *dlock.StaleTokenError
	if !errors.Is(err, dlock.ErrStaleToken) || !errors.As(err, &st) {
		t.Fatalf("%s with %+v = %v, want a *dlock.StaleTokenError wrapping dlock.ErrStaleToken", what, f, err)
	}
	if st.Resource != res || st.Token != f.Token || st.Owner != f.Owner || st.Highest != highest {
		t.Fatalf("%s with %+v: error %+v, want StaleTokenError{Resource: %q, Token: %d, Owner: %q, Highest: %d}", what, f, *st, res, f.Token, f.Owner, highest)
	}
}

func wantHighest(t *testing.T, g guard.Guard, res string, want dlock.Fence) {
	t.Helper()
	hi, err := g.Highest(ctxT(t), res)
	if err != nil {
		t.Fatalf("Highest(%q): %v", res, err)
	}
	if hi != want {
		t.Fatalf("Highest(%q) = %+v, want %+v", res, hi, want)
	}
}

// peek reads name of res through a shared fence at the highest token,
// which is admitted and records nothing.
func peek(t *testing.T, g guard.Guard, res, name string) (string, bool) {
	t.Helper()
	hi, err := g.Highest(ctxT(t), res)
	if err != nil {
		t.Fatalf("Highest(%q): %v", res, err)
	}
	f := dlock.Fence{Token: max(hi.Token, 1), Owner: "guardtest-peek", Shared: true}
	v, ok, err := g.Get(ctxT(t), res, f, name)
	if err != nil {
		t.Fatalf("Get(%q, %q) with shared fence %+v at the highest token: %v", res, name, f, err)
	}
	return v, ok
}

func mustPut(t *testing.T, g guard.Guard, res string, f dlock.Fence, name, value string) {
	t.Helper()
	if err := g.Put(ctxT(t), res, f, name, value); err != nil {
		t.Fatalf("Put(%q, %+v, %q): %v", res, f, name, err)
	}
}

func mustGet(t *testing.T, g guard.Guard, res string, f dlock.Fence, name, want string) {
	t.Helper()
	v, ok, err := g.Get(ctxT(t), res, f, name)
	if err != nil || !ok || v != want {
		t.Fatalf("Get(%q, %+v, %q) = %.40q, %v, %v; want %.40q, true, nil", res, f, name, v, ok, err, want)
	}
}

// step is one row of an admission table: fence, whether it is admitted,
// the highest fence afterwards, and for a refusal the token the
// *dlock.StaleTokenError reports (bar; 0: the highest fence's token).
type step struct {
	f    dlock.Fence
	ok   bool
	hi   dlock.Fence
	note string
	bar  uint64
}

// runTable runs steps on a fresh resource with every operation of g.
// After a Put, the value of "n" is the last admitted Put's.
func (s *suite) runTable(t *testing.T, steps []step) {
	g := s.new(t)
	for _, o := range ops(g) {
		t.Run(o.name, func(t *testing.T) {
			res := Resource("table")
			lastVal, wrote := "", false
			for i, st := range steps {
				var hiBefore dlock.Fence
				if i > 0 {
					hiBefore = steps[i-1].hi
				}
				admitted, err := o.run(ctxT(t), g, res, st.f)
				what := fmt.Sprintf("step %d (%s): %s", i, st.note, o.name)
				if st.ok {
					if err != nil || !admitted {
						t.Fatalf("%s with %+v: admitted=%v err=%v, want admitted", what, st.f, admitted, err)
					}
					if o.name == "Put" {
						lastVal, wrote = fenceValue(st.f), true
					}
				} else {
					if admitted {
						t.Fatalf("%s with %+v was admitted, want refused", what, st.f)
					}
					bar := hiBefore.Token
					if st.bar != 0 {
						bar = st.bar
					}
					checkStale(t, what, err, res, st.f, bar)
				}
				wantHighest(t, g, res, st.hi)
				if o.name == "Put" {
					if v, ok := peek(t, g, res, "n"); ok != wrote || v != lastVal {
						t.Fatalf("%s: value %q (present %v), want %q (present %v)", what, v, ok, lastVal, wrote)
					}
				}
			}
		})
	}
}

// The admission table of exclusive fences, including token extremes.
func (s *suite) testAdmission(t *testing.T) {
	a5, b6 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}
	big := dlock.Fence{Token: 1 << 63, Owner: "c"}
	top := dlock.Fence{Token: math.MaxUint64, Owner: "d"}
	s.runTable(t, []step{
		{dlock.Fence{Token: 0, Owner: "z"}, false, dlock.Fence{}, "zero token on a fresh resource", 0},
		{a5, true, a5, "first fence on a fresh resource", 0},
		{a5, true, a5, "equal token, same owner", 0},
		{dlock.Fence{Token: 5, Owner: "b"}, false, a5, "equal token, other owner", 0},
		{dlock.Fence{Token: 5, Owner: ""}, false, a5, "equal token, no owner", 0},
		{dlock.Fence{Token: 4, Owner: "a"}, false, a5, "lower token, same owner", 0},
		{dlock.Fence{Token: 0, Owner: "a"}, false, a5, "zero token", 0},
		{b6, true, b6, "higher token", 0},
		{a5, false, b6, "the old holder again", 0},
		{big, true, big, "2^63", 0},
		{dlock.Fence{Token: 1<<63 - 1, Owner: "c"}, false, big, "2^63-1 after 2^63", 0},
		{dlock.Fence{Token: math.MaxUint64 - 1, Owner: "d"}, true, dlock.Fence{Token: math.MaxUint64 - 1, Owner: "d"}, "max-1", 0},
		{top, true, top, "max uint64", 0},
		{top, true, top, "max uint64 again, same owner", 0},
		{dlock.Fence{Token: math.MaxUint64 - 1, Owner: "d"}, false, top, "max-1 after max", 0},
	})
	t.Run("NoOwner", func(t *testing.T) {
		// An empty owner is admitted once per token: it never matches.
		e1 := dlock.Fence{Token: 1}
		s.runTable(t, []step{
			{e1, true, e1, "token 1, no owner", 0},
			{e1, false, e1, "token 1, no owner, again", 0},
			{dlock.Fence{Token: 2}, true, dlock.Fence{Token: 2}, "token 2, no owner", 0},
		})
	})
}

// Shared fences are admitted at or above the last exclusive fence, in any
// order among themselves; an exclusive fence below any token admitted, a
// shared one's included, is refused.
func (s *suite) testSharedFences(t *testing.T) {
	sh := func(tok uint64, owner string) dlock.Fence { return dlock.Fence{Token: tok, Owner: owner, Shared: true} }
	a5, b6, c8 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}, dlock.Fence{Token: 8, Owner: "c"}
	zero := dlock.Fence{}
	s.runTable(t, []step{
		{f: sh(0, "s"), hi: zero, note: "shared zero token"},
		{f: sh(1, "s1"), ok: true, hi: zero, note: "shared on a fresh resource"},
		{f: sh(1, "s1"), ok: true, hi: zero, note: "again"},
		{f: a5, ok: true, hi: a5, note: "exclusive above the shared one"},
		{f: a5, ok: true, hi: a5, note: "the exclusive holder again"},
		{f: sh(5, "s1"), ok: true, hi: a5, note: "shared, equal token, other owner"},
		{f: a5, ok: true, hi: a5, note: "the exclusive holder again: nothing above it was admitted"},
		{f: sh(7, "s2"), ok: true, hi: a5, note: "shared above the exclusive fence"},
		{f: sh(6, "s3"), ok: true, hi: a5, note: "shared below another shared: holders valid together"},
		{f: a5, hi: a5, bar: 7, note: "the paused writer after a newer shared holder used the resource"},
		{f: b6, hi: a5, bar: 7, note: "exclusive below a shared token admitted"},
		{f: sh(4, "s4"), hi: a5, note: "shared below the exclusive fence"},
		{f: c8, ok: true, hi: c8, note: "the next exclusive holder"},
		{f: sh(7, "s2"), hi: c8, note: "shared below the new exclusive holder"},
		{f: sh(8, "c"), ok: true, hi: c8, note: "shared at the highest, its owner"},
		{f: c8, ok: true, hi: c8, note: "the exclusive holder again after a shared fence at its token"},
		{f: sh(9, "s5"), ok: true, hi: c8, note: "shared above"},
		{f: c8, hi: c8, bar: 9, note: "the exclusive holder after a newer shared holder"},
		{f: sh(0, "b"), hi: c8, note: "shared zero token"},
		{f: sh(math.MaxUint64, "s6"), ok: true, hi: c8, note: "shared max uint64"},
		{f: dlock.Fence{Token: math.MaxUint64 - 1, Owner: "d"}, hi: c8, bar: math.MaxUint64, note: "exclusive max-1 after a shared max"},
		{f: sh(math.MaxUint64-1, "s7"), ok: true, hi: c8, note: "shared max-1 after a shared max"},
	})
}

// A writer that paused past its lease is refused once a reader or permit
// holder granted after it used the resource, for each shared mode, with
// fences as locks hand them out; holders valid together are admitted
// together, in any order.
func (s *suite) testPausedWriter(t *testing.T) {
	for _, m := range []struct {
		name string
		opt  dlock.Option
	}{{"Shared", dlock.WithShared()}, {"Limited", dlock.WithLimit(2)}} {
		t.Run(m.name, func(t *testing.T) {
			g := s.new(t)
			for _, o := range ops(g) {
				t.Run(o.name, func(t *testing.T) {
					l, key, res := memlock.New(), Resource("lock"), Resource("paused-writer")
					w, err := l.Acquire(ctxT(t), key)
					if err != nil {
						t.Fatal(err)
					}
					fw := w.Fence()
					if ok, err := o.run(ctxT(t), g, res, fw); !ok || err != nil {
						t.Fatalf("%s by the writer: admitted=%v err=%v", o.name, ok, err)
					}
					// The writer pauses; its lease passes (here: released
					// behind its back) and two holders of the shared mode
					// are granted.
					if err := w.Release(ctxT(t)); err != nil {
						t.Fatal(err)
					}
					var holders [2]*dlock.Lock
					for i := range holders {
						if holders[i], err = l.Acquire(ctxT(t), key, m.opt); err != nil {
							t.Fatal(err)
						}
						defer holders[i].Release(context.Background())
					}
					f1, f2 := holders[0].Fence(), holders[1].Fence()
					if !f1.Shared || !f2.Shared || f1.Token <= fw.Token || f2.Token <= f1.Token {
						t.Fatalf("fences %+v, %+v after the writer's %+v: want shared fences with rising tokens", f1, f2, fw)
					}
					// The later holder uses the resource first, then the
					// earlier one: both are admitted.
					for _, f := range []dlock.Fence{f2, f1} {
						if ok, err := o.run(ctxT(t), g, res, f); !ok || err != nil {
							t.Fatalf("%s by holder %+v: admitted=%v err=%v", o.name, f, ok, err)
						}
					}
					// The writer comes back with its old fence.
					ok, err := o.run(ctxT(t), g, res, fw)
					if ok {
						t.Fatalf("%s by the paused writer %+v after holders %+v and %+v used the resource: admitted", o.name, fw, f1, f2)
					}
					checkStale(t, o.name+" by the paused writer", err, res, fw, f2.Token)
					wantHighest(t, g, res, fw)
				})
			}
		})
	}
}

// A fenced read by a newer holder makes an older holder's write fail,
// also when the name was never written.
func (s *suite) testFencedRead(t *testing.T) {
	g := s.new(t)
	res := Resource("account")
	a5, b6, c7 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 6, Owner: "b"}, dlock.Fence{Token: 7, Owner: "c"}
	mustPut(t, g, res, a5, "balance", "100")
	mustGet(t, g, res, b6, "balance", "100")
	wantHighest(t, g, res, b6)
	checkStale(t, "Put by the older holder after a newer one's read", g.Put(ctxT(t), res, a5, "balance", "0"), res, a5, 6)
	_, _, err := g.Get(ctxT(t), res, a5, "balance")
	checkStale(t, "Get by the older holder", err, res, a5, 6)
	if v, ok := peek(t, g, res, "balance"); !ok || v != "100" {
		t.Fatalf("balance = %q, %v after refused writes, want 100", v, ok)
	}
	// A read of a missing name still records its fence.
	v, ok, err := g.Get(ctxT(t), res, c7, "never-written")
	if err != nil || ok || v != "" {
		t.Fatalf("Get of a missing name = %q, %v, %v; want \"\", false, nil", v, ok, err)
	}
	wantHighest(t, g, res, c7)
	checkStale(t, "Put after a newer holder read a missing name", g.Put(ctxT(t), res, b6, "never-written", "x"), res, b6, 7)
	if _, ok := peek(t, g, res, "never-written"); ok {
		t.Fatal("a refused Put created its name")
	}
	// On a fresh resource, a Get of a missing name records the first fence.
	res2 := Resource("fresh")
	if _, ok, err := g.Get(ctxT(t), res2, b6, "n"); err != nil || ok {
		t.Fatalf("Get on a fresh resource = %v, %v; want not found, nil", ok, err)
	}
	wantHighest(t, g, res2, b6)
}

// Values round-trip byte for byte; names of one resource are independent.
func (s *suite) testValues(t *testing.T) {
	g := s.new(t)
	res := Resource("values")
	f := dlock.Fence{Token: 3, Owner: "v"}
	if v, ok, err := g.Get(ctxT(t), res, f, "missing"); err != nil || ok || v != "" {
		t.Fatalf("Get of a missing name = %q, %v, %v; want \"\", false, nil", v, ok, err)
	}
	for _, val := range []string{"v", "", "\x00\xff\xfe binary \r\n", "ü 🔒 {x} }", strings.Repeat("0123456789abcdef", 4096)} {
		mustPut(t, g, res, f, "n", val)
		mustGet(t, g, res, f, "n", val)
	}
	names := []string{"n2", "n2/sub", "n2/", "n2:", "{n2}", "}", "ü", " spaced name\t", "\x01", strings.Repeat("m", dlock.MaxKeyLen)}
	for i, n := range names {
		mustPut(t, g, res, f, n, "value-"+strconv.Itoa(i))
	}
	for i, n := range names {
		mustGet(t, g, res, f, n, "value-"+strconv.Itoa(i))
	}
	mustGet(t, g, res, f, "n", strings.Repeat("0123456789abcdef", 4096))
}

// Resources are independent: fences and names, also when one resource is a
// prefix of another or could be confused with a resource/name pair.
func (s *suite) testIndependent(t *testing.T) {
	g := s.new(t)
	base := Resource("")
	long := base + strings.Repeat("L", dlock.MaxKeyLen-len(base))
	resources := []string{
		base + "a", base + "a/b", base + "a/", base + "a:b", base + "a}", base + "{a}",
		base + "a b\n\t", base + "ü", base + "a\x01", base + "A", long,
	}
	// Decreasing tokens: a resource that shared its fence with an earlier
	// one would refuse its own.
	fence := func(i int) dlock.Fence { return dlock.Fence{Token: uint64(100 - i), Owner: "o" + strconv.Itoa(i)} }
	for i, r := range resources {
		mustPut(t, g, r, fence(i), "n", "v"+strconv.Itoa(i))
	}
	for i, r := range resources {
		wantHighest(t, g, r, fence(i))
		mustGet(t, g, r, fence(i), "n", "v"+strconv.Itoa(i))
	}
	// A refusal on one resource leaves the others alone.
	old := dlock.Fence{Token: 1, Owner: "old"}
	checkStale(t, "Put of an old fence", g.Put(ctxT(t), resources[0], old, "n", "x"), resources[0], old, 100)
	if err := g.Put(ctxT(t), base+"fresh", old, "n", "x"); err != nil {
		t.Fatalf("Put on a fresh resource with token 1: %v", err)
	}
	// A resource/name pair never aliases another one.
	f := dlock.Fence{Token: 1000, Owner: "x"}
	pairs := [][2]string{
		{base + "a", "b/x"}, {base + "a/b", "x"},
		{base + "a", "b:x"}, {base + "a:b", "x"},
		{base + "a", "}:x"}, {base + "a}", "x"},
		{base + "a", "/b/x"}, {base + "a/", "b/x"},
		{base + "a", "x}:y"}, {base + "a}:x", "y"},
		{base + "a", "x\x01y"}, {base + "a\x01x", "y"},
	}
	for i, p := range pairs {
		mustPut(t, g, p[0], f, p[1], "pair-"+strconv.Itoa(i))
	}
	for i, p := range pairs {
		mustGet(t, g, p[0], f, p[1], "pair-"+strconv.Itoa(i))
	}
}

// Bad input is an error, never a panic, and records and reports nothing.
func (s *suite) testBadInput(t *testing.T) {
	var rec dlocktest.Recorder
	g := s.new(t, dlock.WithObserver(&rec))
	res := Resource("bad")
	f := dlock.Fence{Token: 5, Owner: "a"}
	var nilCtx context.Context
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tooLong := strings.Repeat("x", dlock.MaxKeyLen+1)
	badKeys := map[string]string{"empty": "", "too long": tooLong, "invalid UTF-8": "a\xffb", "NUL": "a\x00b"}
	doer, isDoer := g.(guard.Doer)

	type call struct {
		name string
		fn   func() error
		want error
	}
	var calls []call
	add := func(name string, want error, ctx context.Context, r, n string) {
		calls = append(calls,
			call{"Put" + name, func() error { return g.Put(ctx, r, f, n, "v") }, want},
			call{"Get" + name, func() error { _, _, err := g.Get(ctx, r, f, n); return err }, want},
		)
		if n == "n" {
			calls = append(calls, call{"Highest" + name, func() error { _, err := g.Highest(ctx, r); return err }, want})
			if isDoer {
				calls = append(calls, call{"Do" + name, func() error {
					return doer.Do(ctx, r, f, func(context.Context) error { return errors.New("fn ran") })
				}, want})
			}
		}
	}
	add("(nil ctx)", dlock.ErrInvalidOption, nilCtx, res, "n")
	add("(cancelled ctx)", context.Canceled, cancelled, res, "n")
	for what, k := range badKeys {
		add("(resource "+what+")", dlock.ErrInvalidKey, ctxT(t), k, "n")
		add("(name "+what+")", dlock.ErrInvalidKey, ctxT(t), res, k)
	}
	// A nil context is reported before a bad resource or name.
	add("(nil ctx, empty resource and name)", dlock.ErrInvalidOption, nilCtx, "", "")
	if isDoer {
		calls = append(calls, call{"Do(nil fn)", func() error { return doer.Do(ctxT(t), res, f, nil) }, dlock.ErrInvalidOption})
	}
	// An owner over guard.MaxOwnerLen is refused before any I/O: on
	// ZooKeeper one made a request over the packet limit, and the server
	// dropped the connection with every lock on it.
	long := dlock.Fence{Token: 9, Owner: strings.Repeat("o", 40<<10)}
	calls = append(calls,
		call{"Put(owner over MaxOwnerLen)", func() error { return g.Put(ctxT(t), res, long, "n", "v") }, dlock.ErrInvalidOption},
		call{"Get(owner over MaxOwnerLen)", func() error { _, _, err := g.Get(ctxT(t), res, long, "n"); return err }, dlock.ErrInvalidOption},
	)
	if isDoer {
		calls = append(calls, call{"Do(owner over MaxOwnerLen)", func() error {
			return doer.Do(ctxT(t), res, long, func(context.Context) error { return errors.New("fn ran") })
		}, dlock.ErrInvalidOption})
	}
	for _, c := range calls {
		if err := protect(c.fn); !errors.Is(err, c.want) {
			t.Errorf("%s = %v, want an error wrapping %v", c.name, err, c.want)
		}
	}
	wantHighest(t, g, res, dlock.Fence{})
	if v, ok := peek(t, g, res, "n"); ok {
		t.Errorf("bad calls wrote %q", v)
	}
	if n := len(rec.Events()); n != 0 {
		t.Errorf("bad calls reported %d events: %+v", n, rec.Events())
	}
	// The guard still works, with an owner of MaxOwnerLen bytes too.
	mustPut(t, g, res, f, "n", "ok")
	mustGet(t, g, res, f, "n", "ok")
	mustPut(t, g, res, dlock.Fence{Token: 6, Owner: strings.Repeat("o", guard.MaxOwnerLen)}, "n", "ok")
}

// Every refusal reports exactly one EventRejected matching its error;
// admitted operations report nothing. Nil options are accepted.
func (s *suite) testObserver(t *testing.T) {
	var rec dlocktest.Recorder
	g := s.new(t, nil, dlock.WithObserver(&rec), nil)
	res := Resource("observed")
	type refusal struct {
		err *dlock.StaleTokenError
		f   dlock.Fence
	}
	var refused []refusal
	try := func(o op, f dlock.Fence, wantOK bool) {
		t.Helper()
		admitted, err := o.run(ctxT(t), g, res, f)
		if admitted != wantOK {
			t.Fatalf("%s with %+v: admitted=%v err=%v, want admitted=%v", o.name, f, admitted, err, wantOK)
		}
		if wantOK {
			if err != nil {
				t.Fatalf("%s with %+v: %v", o.name, f, err)
			}
			return
		}
		var st *dlock.StaleTokenError
		if !errors.As(err, &st) {
			t.Fatalf("%s with %+v = %v, want a *dlock.StaleTokenError", o.name, f, err)
		}
		refused = append(refused, refusal{st, f})
	}
	for i, o := range ops(g) {
		base := uint64(10 * (i + 1))
		try(o, dlock.Fence{Token: 0, Owner: "z"}, false)
		try(o, dlock.Fence{Token: base, Owner: "a"}, true)
		try(o, dlock.Fence{Token: base, Owner: "a"}, true)
		try(o, dlock.Fence{Token: base, Owner: "b"}, false)
		try(o, dlock.Fence{Token: base - 1, Owner: "c"}, false)
		try(o, dlock.Fence{Token: base + 5, Owner: "s", Shared: true}, true)
		try(o, dlock.Fence{Token: base - 1, Owner: "s", Shared: true}, false)
	}
	ev := rec.Events()
	if len(ev) != len(refused) {
		t.Fatalf("observer got %d events for %d refusals: %+v", len(ev), len(refused), ev)
	}
	for i, e := range ev {
		r := refused[i]
		want := dlock.Event{Kind: dlock.EventRejected, Backend: ev[0].Backend, Key: res, Mode: dlock.Exclusive, Token: r.f.Token, Owner: r.f.Owner, Highest: r.err.Highest}
		if r.f.Shared {
			want.Mode = dlock.Shared
		}
		if e != want || e.Backend == "" {
			t.Errorf("event %d = %+v, want %+v with a backend name", i, e, want)
		}
	}
	// WithObserver(nil) is no observer.
	g2 := s.new(t, dlock.WithObserver(nil))
	res2 := Resource("unobserved")
	mustPut(t, g2, res2, dlock.Fence{Token: 2, Owner: "a"}, "n", "v")
	checkStale(t, "Put", g2.Put(ctxT(t), res2, dlock.Fence{Token: 1, Owner: "a"}, "n", "v"), res2, dlock.Fence{Token: 1, Owner: "a"}, 2)
}

// instances returns g and, for a Shared guard, a second instance on its
// store (else g again).
func (s *suite) instances(t *testing.T, g guard.Guard) [2]guard.Guard {
	if s.cfg.other == nil {
		return [2]guard.Guard{g, g}
	}
	return [2]guard.Guard{g, s.cfg.other(t, g)}
}

// Concurrent callers with increasing tokens: the highest fence never goes
// back, an admitted read never sees a write of a newer fence, a refusal
// names a newer fence, and the last admitted write wins.
func (s *suite) testConcurrent(t *testing.T) {
	const workers, perWorker = 8, 25
	gs := s.instances(t, s.new(t))
	res := Resource("concurrent")
	for _, g := range gs { // connect before the goroutine snapshot
		if _, err := g.Highest(ctxT(t), res); err != nil {
			t.Fatal(err)
		}
	}
	defer goleak.VerifyNone(t, append(s.cfg.leakOpts, goleak.IgnoreCurrent())...)
	ctx := ctxT(t)

	var (
		tok       atomic.Uint64
		owners    sync.Map // token -> owner, stored before the token is used
		mu        sync.Mutex
		maxAdmit  uint64 // highest admitted token
		maxPut    uint64 // highest admitted Put's token
		admitted  int
		total     int
		wg        sync.WaitGroup
		pollDone  = make(chan struct{})
		pollerErr = make(chan error, 1)
	)
	go func() { // Highest never goes back
		defer close(pollerErr)
		var last dlock.Fence
		for i := 0; ; i++ {
			select {
			case <-pollDone:
				return
			default:
			}
			hi, err := gs[i%2].Highest(ctx, res)
			if err != nil {
				pollerErr <- err
				return
			}
			if hi.Token < last.Token {
				pollerErr <- fmt.Errorf("Highest went back from %+v to %+v", last, hi)
				return
			}
			if o, ok := owners.Load(hi.Token); hi.Token != 0 && (!ok || o.(string) != hi.Owner) {
				pollerErr <- fmt.Errorf("Highest = %+v, but token %d was used by %v", hi, hi.Token, o)
				return
			}
			last = hi
		}
	}()
	for w := range workers {
		owner := "w" + strconv.Itoa(w)
		g := gs[w%2]
		wg.Go(func() {
			// do runs one operation with token tk and reports whether it
			// was admitted.
			do := func(tk uint64, isPut bool) bool {
				owners.Store(tk, owner)
				f := dlock.Fence{Token: tk, Owner: owner}
				var err error
				if isPut {
					err = g.Put(ctx, res, f, "last", strconv.FormatUint(tk, 10))
				} else {
					var v string
					var ok bool
					v, ok, err = g.Get(ctx, res, f, "last")
					if err == nil && ok {
						if seen, perr := strconv.ParseUint(v, 10, 64); perr != nil || seen >= tk {
							t.Errorf("Get with token %d saw %q: a write of a newer (or its own) fence", tk, v)
						}
					}
				}
				var st *dlock.StaleTokenError
				switch {
				case err == nil:
					mu.Lock()
					total++
					admitted++
					maxAdmit = max(maxAdmit, tk)
					if isPut {
						maxPut = max(maxPut, tk)
					}
					mu.Unlock()
					return true
				case errors.As(err, &st):
					mu.Lock()
					total++
					mu.Unlock()
					if st.Highest <= tk {
						t.Errorf("token %d refused with highest %d: not newer", tk, st.Highest)
					}
				default:
					t.Errorf("token %d: %v", tk, err)
				}
				return false
			}
			for j := range perWorker {
				// Tokens come in pairs; every third operation is followed
				// by one with the lower token of its pair, which is stale
				// by then whatever happened to the first.
				tk := tok.Add(2)
				isPut := (w+j)%2 == 0
				do(tk, isPut)
				if j%3 == 2 && do(tk-1, !isPut) {
					t.Errorf("token %d admitted after token %d was used", tk-1, tk)
				}
			}
		})
	}
	wg.Wait()
	close(pollDone)
	if err := <-pollerErr; err != nil {
		t.Fatal(err)
	}
	if admitted == 0 {
		t.Fatal("no operation admitted")
	}
	hi, err := gs[0].Highest(ctx, res)
	if err != nil || hi.Token != maxAdmit {
		t.Fatalf("Highest = %+v, %v; want token %d, the highest admitted", hi, err, maxAdmit)
	}
	if maxPut > 0 {
		if v, ok := peek(t, gs[1], res, "last"); !ok || v != strconv.FormatUint(maxPut, 10) {
			t.Fatalf("last = %q, %v; want %d, the highest admitted Put", v, ok, maxPut)
		}
	}
	t.Logf("%d of %d operations admitted", admitted, total)
}

// Do (for a guard.Doer): fn runs only when admitted, its error comes back
// as is with the fence kept, Do calls on a resource never overlap (across
// instances of a Shared guard too), and waiting behind one honours ctx.
func (s *suite) testDo(t *testing.T) {
	g := s.new(t)
	d, ok := g.(guard.Doer)
	if !ok {
		t.Skip("not a guard.Doer")
	}
	gs := s.instances(t, g)
	d2, ok := gs[1].(guard.Doer)
	if !ok {
		t.Fatalf("the second instance (%T) is not a guard.Doer", gs[1])
	}
	doers := [2]guard.Doer{d, d2}
	res := Resource("do")

	boom := errors.New("boom")
	if err := d.Do(ctxT(t), res, dlock.Fence{Token: 3, Owner: "f"}, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("Do = %v, want fn's error as is", err)
	}
	wantHighest(t, g, res, dlock.Fence{Token: 3, Owner: "f"})
	var ctxKey struct{}
	ctx := context.WithValue(ctxT(t), ctxKey, "v")
	if err := d.Do(ctx, res, dlock.Fence{Token: 3, Owner: "f"}, func(fctx context.Context) error {
		if fctx.Value(ctxKey) != "v" {
			return errors.New("fn's context is not derived from Do's")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// No overlap.
	for _, g := range gs {
		if _, err := g.Highest(ctxT(t), res); err != nil {
			t.Fatal(err)
		}
	}
	leakCheck := goleak.IgnoreCurrent()
	var (
		inside, violations atomic.Int32
		tok                atomic.Uint64
		wg                 sync.WaitGroup
	)
	tok.Store(10)
	for w := range 8 {
		wg.Go(func() {
			for range 5 {
				f := dlock.Fence{Token: tok.Add(1), Owner: "w" + strconv.Itoa(w)}
				err := doers[w%2].Do(ctxT(t), res, f, func(context.Context) error {
					if inside.Add(1) != 1 {
						violations.Add(1)
					}
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					return nil
				})
				if err != nil && !errors.Is(err, dlock.ErrStaleToken) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d overlapping Do calls", v)
	}

	// Waiting behind a running Do ends with ctx; Highest does not wait.
	running := dlock.Fence{Token: 1000, Owner: "long"}
	entered, leave := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- d.Do(ctxT(t), res, running, func(context.Context) error {
			close(entered)
			<-leave
			return nil
		})
	}()
	select {
	case <-entered:
	case <-time.After(dlocktest.HangTimeout):
		t.Fatal("hang: Do's fn did not start")
	}
	next := dlock.Fence{Token: 1001, Owner: "next"}
	for i, g := range gs {
		wantHighest(t, g, res, running)
		for _, o := range ops(g) {
			ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
			admitted, err := o.run(ctx, g, res, next)
			cancel()
			if admitted || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("instance %d: %s behind a running Do: admitted=%v err=%v, want DeadlineExceeded", i, o.name, admitted, err)
			}
		}
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantHighest(t, g, res, running)
	goleak.VerifyNone(t, append(s.cfg.leakOpts, leakCheck)...)
}

// Every call on a stalled link returns by its context's deadline, with
// an error wrapping dlock.ErrUnavailable and the context's error: the
// same sentinel on every guard, as for the lock calls.
func (s *suite) testStalledStore(t *testing.T) {
	if s.cfg.stalled == nil {
		t.Skip("the guard's store is local: no link to stall (no guardtest.Stallable)")
	}
	g, stall := s.cfg.stalled(t)
	res, f := Resource("stalled"), dlock.Fence{Token: 5, Owner: "a"}
	mustPut(t, g, res, f, "n", "v") // connected, and the resource exists
	stall()
	calls := []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"Put", func(ctx context.Context) error { return g.Put(ctx, res, f, "n", "w") }},
		{"Get", func(ctx context.Context) error { _, _, err := g.Get(ctx, res, f, "n"); return err }},
		{"Highest", func(ctx context.Context) error { _, err := g.Highest(ctx, res); return err }},
	}
	if d, ok := g.(guard.Doer); ok {
		calls = append(calls, struct {
			name string
			fn   func(ctx context.Context) error
		}{"Do", func(ctx context.Context) error {
			return d.Do(ctx, res, f, func(context.Context) error { return nil })
		}})
	}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- protect(func() error { return c.fn(ctx) }) }()
		select {
		case err := <-done:
			if !errors.Is(err, dlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s on a stalled link = %v, want an error wrapping dlock.ErrUnavailable and context.DeadlineExceeded", c.name, err)
			}
		case <-time.After(dlocktest.HangTimeout):
			t.Errorf("hang: %s on a stalled link did not return by its context's deadline", c.name)
		}
		cancel()
	}
}

// A second instance on the same store (Shared) sees and respects the
// first one's fences and values, and a third one opened later too.
func (s *suite) testSecondInstance(t *testing.T) {
	if s.cfg.other == nil {
		t.Skip("the guard's state is not shared between instances (no guardtest.Shared)")
	}
	var rec dlocktest.Recorder
	g1 := s.new(t)
	g2 := s.cfg.other(t, g1, dlock.WithObserver(&rec))
	res := Resource("shared")
	a5, c9 := dlock.Fence{Token: 5, Owner: "a"}, dlock.Fence{Token: 9, Owner: "c"}
	mustPut(t, g1, res, a5, "n", "1")
	wantHighest(t, g2, res, a5)
	mustGet(t, g2, res, a5, "n", "1")
	b4 := dlock.Fence{Token: 4, Owner: "b"}
	checkStale(t, "Put on the second instance", g2.Put(ctxT(t), res, b4, "n", "x"), res, b4, 5)
	if n := len(rec.Events()); n != 1 {
		t.Errorf("the second instance's observer got %d events, want 1", n)
	}
	mustPut(t, g2, res, c9, "n", "2")
	wantHighest(t, g1, res, c9)
	d8 := dlock.Fence{Token: 8, Owner: "d"}
	checkStale(t, "Put on the first instance", g1.Put(ctxT(t), res, d8, "n", "x"), res, d8, 9)
	mustGet(t, g1, res, c9, "n", "2")
	g3 := s.cfg.other(t, g2)
	wantHighest(t, g3, res, c9)
	mustGet(t, g3, res, c9, "n", "2")
	if len(rec.Events()) != 1 {
		t.Errorf("the second instance's observer saw the first instance's refusal")
	}
}
