package testserver

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// Shared returns the server called name that the package's tests share,
// started by start if no test has started it yet. It is for servers the
// tests neither pause, stop nor reconfigure, on which each test uses keys,
// paths or databases of its own: starting a ZooKeeper or PostgreSQL costs
// more than most tests that use it.
//
// start gets a TB of the package's: while start runs, a failure or skip
// is the calling test's (and the next test that asks tries again); after
// that, its errors are the package's, reported by Main. Its cleanups run
// once the package's tests are done, before Main looks for leaked
// goroutines (AfterTests), so the package's TestMain must be Main.
func Shared[T any](t TB, name string, start func(TB) T) T {
	t.Helper()
	sharedMu.Lock()
	s := shareds[name]
	if s == nil {
		s = &shared{}
		shareds[name] = s
		if len(shareds) == 1 {
			AfterTests(stopShared)
		}
	}
	sharedMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.val == nil {
		tb := &packageTB{t: t}
		v := start(tb) // a failure ends t here
		tb.started()
		s.val = v
	}
	return s.val.(T)
}

type shared struct {
	mu  sync.Mutex // held while it starts
	val any        // nil until started
}

var (
	sharedMu       sync.Mutex
	shareds        = map[string]*shared{}
	sharedCleanups []func()
	sharedErrs     []string
)

// stopShared runs the shared servers' cleanups, last first, and returns
// what went wrong with them after they started.
func stopShared() error {
	sharedMu.Lock()
	fs := sharedCleanups
	sharedCleanups = nil
	sharedMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if len(sharedErrs) == 0 {
		return nil
	}
	return errors.New("shared server: " + fmt.Sprint(sharedErrs))
}

// packageTB is the TB of a shared server: the starting test's while it
// starts, the package's after.
type packageTB struct {
	mu sync.Mutex
	t  TB // nil once started
}

func (p *packageTB) started() {
	p.mu.Lock()
	p.t = nil
	p.mu.Unlock()
}

func (p *packageTB) test() TB {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.t
}

func (p *packageTB) Helper() {}

func (p *packageTB) Errorf(format string, args ...any) {
	if t := p.test(); t != nil {
		t.Helper()
		t.Errorf(format, args...)
		return
	}
	sharedMu.Lock()
	sharedErrs = append(sharedErrs, fmt.Sprintf(format, args...))
	sharedMu.Unlock()
}

func (p *packageTB) Fatalf(format string, args ...any) {
	if t := p.test(); t != nil {
		t.Helper()
		t.Fatalf(format, args...)
	}
	p.Errorf(format, args...)
}

func (p *packageTB) Fatal(args ...any) { p.Fatalf("%s", fmt.Sprint(args...)) }

func (p *packageTB) Skip(args ...any) {
	if t := p.test(); t != nil {
		t.Skip(args...)
	}
}

func (p *packageTB) Cleanup(f func()) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	sharedCleanups = append(sharedCleanups, f)
}

func (p *packageTB) TempDir() string {
	dir, err := os.MkdirTemp("", "dlock-shared-")
	if err != nil {
		p.Fatal(err)
	}
	p.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
