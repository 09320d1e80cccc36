package dlock_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// The zero Engine (a backend's Locker declared as a value, or a struct
// literal that forgot NewEngine) fails every call with ErrNilClient, like
// a nil *Engine.
// Symptom: Acquire on the zero Engine panicked with a nil dereference.
func TestEngine_ZeroValueFailsWithErrNilClient(t *testing.T) {
	var e dlock.Engine
	ctx := context.Background()
	if _, err := e.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("TryAcquire on the zero Engine: %v, want ErrNilClient", err)
	}
	if _, err := e.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Acquire on the zero Engine: %v, want ErrNilClient", err)
	}
	if _, err := e.List(ctx, ""); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("List on the zero Engine: %v, want ErrNilClient", err)
	}
}

// An Engine over no driver, or over driver.Failed, fails every call with
// the constructor's error; a nil *Engine (a nil backend Locker's) too.
func TestNewEngine_FailedDriverFailsEveryCall(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		e    *dlock.Engine
		want error
	}{
		{"nil driver", dlock.NewEngine(nil), dlock.ErrNilClient},
		{"driver.Failed(nil)", dlock.NewEngine(driver.Failed(nil)), dlock.ErrNilClient},
		{"driver.Failed(boom)", dlock.NewEngine(driver.Failed(boom)), boom},
		{"nil *Engine", nil, dlock.ErrNilClient},
	} {
		if _, err := tc.e.Acquire(ctxT(t), "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: Acquire = %v, want %v", tc.name, err, tc.want)
		}
		if _, err := tc.e.TryAcquire(ctxT(t), "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: TryAcquire = %v, want %v", tc.name, err, tc.want)
		}
		if _, err := tc.e.List(ctxT(t), ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: List = %v, want %v", tc.name, err, tc.want)
		}
		if _, err := tc.e.Break(ctxT(t), "k", ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: Break = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestUnsupportedModeNamesIt(t *testing.T) {
	e := dlock.NewEngine(newSlowClient(newStore()))
	for _, o := range []struct {
		opt  dlock.Option
		name string
	}{{dlock.WithShared(), "shared"}, {dlock.WithLimit(3), "limited"}} {
		_, err := e.TryAcquire(ctxT(t), "k", o.opt)
		if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), o.name) {
			t.Errorf("%s on a driver without it: %v", o.name, err)
		}
	}
}

// junkBackend returns whatever the test says.
type junkBackend struct {
	try   func() (driver.Grant, error)
	tries atomic.Int32
}

func (b *junkBackend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.tries.Add(1)
	return b.try()
}

func (*junkBackend) Spec() driver.Spec { return driver.Spec{Name: "test"} }

type okLease struct{ refreshes atomic.Int32 }

func (l *okLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.refreshes.Add(1)
	return nil
}

func (l *okLease) Release(ctx context.Context) error { return nil }

// batchJunk: RefreshBatch misbehaves in the given way.
type batchJunk struct {
	junkBackend
	mode  string
	calls atomic.Int32
}

func (b *batchJunk) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	b.calls.Add(1)
	switch b.mode {
	case "twice":
		for i := range rs {
			done(i, nil)
			done(i, errors.New("second report"))
		}
	case "range":
		done(-1, nil)
		done(len(rs), nil)
		done(1<<30, nil)
	case "never":
	case "after-return":
		go func() {
			time.Sleep(5 * time.Millisecond)
			for i := range rs {
				done(i, nil)
			}
		}()
	case "nil-ok":
		for i := range rs {
			done(i, nil)
		}
	}
}

// Malformed driver answers (a grant without a lease, token 0, a batch
// renewal reporting twice, out of range, never or after returning) make
// no panic and no hang.
func TestEngine_SurvivesMalformedDriverAnswers(t *testing.T) {
	t.Run("nil Lease in a successful Grant", func(t *testing.T) {
		b := &junkBackend{try: func() (driver.Grant, error) { return driver.Grant{Token: 1}, nil }}
		a := dlock.NewEngine(b)
		lk, err := a.TryAcquire(context.Background(), "k")
		t.Logf("TryAcquire: lk=%v err=%v", lk, err)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = a.Acquire(ctx, "k")
		t.Logf("Acquire(50ms): err=%v after %d tries", err, b.tries.Load())
	})
	t.Run("zero token", func(t *testing.T) {
		b := &junkBackend{try: func() (driver.Grant, error) { return driver.Grant{Lease: &okLease{}}, nil }}
		a := dlock.NewEngine(b)
		lk, err := a.TryAcquire(context.Background(), "k")
		if err == nil {
			t.Logf("a grant with token 0 is handed out: Token()=%d; a fresh guard admits it? %v", lk.Token(), dlock.FenceRecord{}.Admits(lk.Fence()))
			lk.Release(context.Background())
		}
	})
	for _, mode := range []string{"twice", "range", "never", "after-return", "nil-ok"} {
		t.Run("RefreshBatch "+mode, func(t *testing.T) {
			b := &batchJunk{mode: mode}
			lease := &okLease{}
			b.try = func() (driver.Grant, error) { return driver.Grant{Lease: lease, Token: 1}, nil }
			a := dlock.NewEngine(b)
			lk, err := a.TryAcquire(context.Background(), "k", dlock.WithTTL(150*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lk.Lost():
				t.Logf("lost after %d batches: %v", b.calls.Load(), lk.Err())
			case <-time.After(600 * time.Millisecond):
				t.Logf("still held after 600ms, %d batches", b.calls.Load())
			}
			lk.Release(context.Background())
		})
	}
}

// optDriver keeps its options in another package (net/http stands for it)
// and says so in its Spec, or not.
type optDriver struct{ pkg string }

func (d optDriver) Spec() driver.Spec {
	return driver.Spec{Name: "optfake", OptionPackage: d.pkg}
}
func (optDriver) Try(context.Context, *driver.Request) (driver.Grant, error) {
	return driver.Grant{}, errors.New("unused")
}

// A backend's own options are accepted where its Spec says they live; an
// option of any other package is ErrInvalidOption naming that package.
func TestNewEngine_OptionPackage(t *testing.T) {
	opt := driver.Setting(func(*http.Request) {})
	if _, err := dlock.NewEngine(optDriver{pkg: "net/http"}, opt).List(ctxT(t), ""); errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("an option of the Spec's OptionPackage was refused: %v", err)
	}
	_, err := dlock.NewEngine(optDriver{}, opt).TryAcquire(ctxT(t), "k")
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), "http option") {
		t.Errorf("an option of another package = %v, want ErrInvalidOption naming http", err)
	}
}
