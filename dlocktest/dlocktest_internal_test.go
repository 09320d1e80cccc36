package dlocktest

// The suite's own tests: each runs suite tests, in a child process,
// against a backend with a real defect, and expects the suite to fail it. A control runs the same
// suite tests against the same backend without the defect, which must
// pass (so a failure of the control means the harness here is wrong, not
// the suite).

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// defectStore is a minimal exclusive lock service (polling only).
type defectStore struct {
	// startSkew > 0: a Grant's Start is reported startSkew before the
	// attempt (a lease start read from a server clock that lags, say):
	// every lock's local deadline is that much earlier than it should be.
	startSkew time.Duration
	// eofAtEnd: an attempt of a blocking Acquire after its first refusal
	// waits server-side for the key, and when the caller's context ends
	// reports a broken connection instead of the context's end.
	eofAtEnd bool

	mu      sync.Mutex
	token   uint64
	holders map[string]*defectLease
	refused map[string]bool // waiters refused once
}

type defectLease struct {
	s       *defectStore
	key     string
	owner   string
	token   uint64
	expires time.Time
}

func newDefectStore() *defectStore {
	return &defectStore{holders: map[string]*defectLease{}, refused: map[string]bool{}}
}

func (s *defectStore) Spec() driver.Spec { return driver.Spec{Name: "defect"} }

func (s *defectStore) held(key string, now time.Time) *defectLease {
	if l := s.holders[key]; l != nil && now.Before(l.expires) {
		return l
	}
	return nil
}

func (s *defectStore) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	for {
		s.mu.Lock()
		now := time.Now()
		h := s.held(req.Key, now)
		if h == nil {
			s.token++
			l := &defectLease{s: s, key: req.Key, owner: req.Owner, token: s.token, expires: now.Add(req.TTL)}
			s.holders[req.Key] = l
			s.mu.Unlock()
			g := driver.Grant{Lease: l, Token: l.token}
			if s.startSkew > 0 {
				g.Start = now.Add(-s.startSkew)
			}
			return g, nil
		}
		if !s.eofAtEnd || req.Waiter == "" || !s.refused[req.Waiter] {
			if req.Waiter != "" {
				s.refused[req.Waiter] = true
			}
			s.mu.Unlock()
			return driver.Grant{}, &dlock.NotAcquiredError{Key: req.Key, Holders: []dlock.Holder{{Owner: h.owner, Token: h.token, TTL: h.expires.Sub(now)}}}
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return driver.Grant{}, io.ErrUnexpectedEOF // the defect: not ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (l *defectLease) Refresh(ctx context.Context, ttl time.Duration) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.held(l.key, time.Now()) != l {
		return dlock.ErrNotHeld
	}
	l.expires = time.Now().Add(ttl)
	return nil
}

func (l *defectLease) Release(ctx context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.s.held(l.key, time.Now()) != l {
		return dlock.ErrNotHeld
	}
	delete(l.s.holders, l.key)
	return nil
}

func defectHarness(s *defectStore) Harness {
	e := dlock.NewEngine(s)
	return Harness{New: func(testing.TB) dlock.Locker { return e }, TTL: time.Second}
}

const defectChildEnv = "DLOCKTEST_DEFECT_CHILD"

// runChild runs the test named name in a child process with the
// environment variable set to mode and reports whether it passed.
func runChild(t *testing.T, name, mode string) (bool, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), defectChildEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	return err == nil, string(out)
}

// lastLines returns the last n lines of s, for a readable failure.
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// A backend whose locks are all lost ~2ms after they are granted (its
// Grant.Start lies 285ms in the past for a 300ms lease) must fail
// ShortTTLContention: no lock it hands out survives its holder's 5ms of
// work. Counting a loss at the local deadline as the deadline's promise,
// whatever the proportion, passed it.
func TestShortTTLContention_RejectsLocksLostAtGrant(t *testing.T) {
	switch os.Getenv(defectChildEnv) {
	case "broken":
		testShortTTLContention(t, defectHarness(&defectStore{startSkew: 285 * time.Millisecond, holders: map[string]*defectLease{}, refused: map[string]bool{}}))
		return
	case "healthy":
		testShortTTLContention(t, defectHarness(newDefectStore()))
		return
	case "":
	default:
		t.Skip("child of another test")
	}
	if ok, out := runChild(t, t.Name(), "healthy"); !ok {
		t.Fatalf("control: ShortTTLContention fails a healthy backend:\n%s", lastLines(out, 15))
	}
	if ok, out := runChild(t, t.Name(), "broken"); ok {
		t.Errorf("ShortTTLContention passed a backend whose every lock is lost ~2ms after the grant:\n%s", lastLines(out, 6))
	}
}

// A backend that reports a blocking wait's end as a broken connection
// (io.ErrUnexpectedEOF instead of the context's error) makes every timed
// out Acquire on a held key an outage (ErrUnavailable; dlock run: exit 3,
// "backend error") although the key was seen held throughout.
// AcquireDeadline, AcquireCancel and WithWait accepted it when they took
// any ErrUnavailable that named the holder seen.
func TestWaitEnd_RejectsBackendErrorAtContextEnd(t *testing.T) {
	tests := map[string]func(*testing.T, Harness){
		"AcquireDeadline": testAcquireDeadline,
		"AcquireCancel":   testAcquireCancel,
		"WithWait":        testWithWait,
	}
	switch mode := os.Getenv(defectChildEnv); {
	case strings.HasPrefix(mode, "broken/"), strings.HasPrefix(mode, "healthy/"):
		name := mode[strings.Index(mode, "/")+1:]
		s := newDefectStore()
		s.eofAtEnd = strings.HasPrefix(mode, "broken/")
		tests[name](t, defectHarness(s))
		return
	case mode != "":
		t.Skip("child of another test")
	}
	for name := range tests {
		t.Run(name, func(t *testing.T) {
			if ok, out := runChild(t, "TestWaitEnd_RejectsBackendErrorAtContextEnd", "healthy/"+name); !ok {
				t.Fatalf("control: %s fails a healthy backend:\n%s", name, lastLines(out, 15))
			}
			if ok, out := runChild(t, "TestWaitEnd_RejectsBackendErrorAtContextEnd", "broken/"+name); ok {
				t.Errorf("%s passed a backend that reports the wait's end as io.ErrUnexpectedEOF:\n%s", name, lastLines(out, 6))
			}
		})
	}
}
