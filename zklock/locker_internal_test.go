package zklock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
)

// Symptom: a Release retried right after a lost reply failed with "zk:
// could not connect to a server": go-zookeeper drops the requests it has
// not sent each time it goes round its servers to reconnect (with one
// address, at every reconnection), even when the next dial succeeds.
// A request dropped unsent is sent once more when the client has a
// session again; one dropped twice is the outage it reports (transient:
// nothing was sent); any other error is not sent again.
func TestCall_DroppedUnsent_SentOnceMoreWithASession(t *testing.T) {
	b := &backend{timeout: time.Minute}
	var up atomic.Bool
	b.hooks.Store(&testHooks{hasSession: up.Load})
	for _, c := range []struct {
		name  string
		errs  []error
		sends int32
		want  error
	}{
		{"dropped once", []error{zk.ErrNoServer, nil}, 2, nil},
		{"dropped twice", []error{zk.ErrNoServer, zk.ErrNoServer, nil}, 2, dlock.ErrTransient},
		{"connection closed", []error{zk.ErrConnectionClosed, nil}, 1, dlock.ErrUnavailable},
	} {
		var n atomic.Int32
		up.Store(false)
		b.noteReply(nil) // the server answered a moment ago
		time.AfterFunc(50*time.Millisecond, func() { up.Store(true) })
		v, err := call(context.Background(), b, "test", func() (int, error) {
			i := n.Add(1) - 1
			if i > 0 && !up.Load() {
				t.Errorf("%s: sent again before the client had a session", c.name)
			}
			if e := c.errs[i]; e != nil {
				return 0, e
			}
			return 7, nil
		})
		switch {
		case n.Load() != c.sends:
			t.Errorf("%s: sent %d times, want %d", c.name, n.Load(), c.sends)
		case c.want == nil && (err != nil || v != 7):
			t.Errorf("%s: %d, %v; want 7", c.name, v, err)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
}

// Symptom: a request dropped unsent during an outage was reported, once
// the request timeout ran out, as "no answer" (not transient), and a
// blocking Acquire gave up at that timeout instead of its deadline.
// A caller that gives up while the resend still waits for a session hears
// that nothing was sent (transient), and the request is not sent later.
func TestCall_GivesUpBeforeTheSession_TransientAndNeverSent(t *testing.T) {
	b := &backend{timeout: 100 * time.Millisecond}
	var up atomic.Bool
	b.hooks.Store(&testHooks{hasSession: up.Load})
	b.noteReply(nil) // the server answered a moment ago
	var n atomic.Int32
	_, err := call(context.Background(), b, "test", func() (int, error) {
		n.Add(1)
		return 0, zk.ErrNoServer
	})
	if !errors.Is(err, dlock.ErrTransient) || !errors.Is(err, zk.ErrNoServer) {
		t.Fatalf("call given up before a session: %v; want transient, never sent", err)
	}
	up.Store(true)
	time.Sleep(5 * noServerPause) // a resend would go now
	if n.Load() != 1 {
		t.Fatalf("sent %d times; want once", n.Load())
	}
}

// During an outage a request dropped unsent waits at most sessionWait for
// a session, then reports the outage (transient: nothing was sent), well
// before the request timeout, and is not sent later.
func TestCall_NoSessionWithinTheWait_TransientAndNeverSent(t *testing.T) {
	b := &backend{timeout: time.Hour}
	var up atomic.Bool
	b.hooks.Store(&testHooks{hasSession: up.Load})
	b.noteReply(nil) // the server answered a moment ago
	var n atomic.Int32
	start := time.Now()
	_, err := call(context.Background(), b, "test", func() (int, error) {
		n.Add(1)
		return 0, zk.ErrNoServer
	})
	if !errors.Is(err, dlock.ErrTransient) || !errors.Is(err, zk.ErrNoServer) || time.Since(start) >= b.timeout {
		t.Fatalf("call without a session: %v after %v; want transient, never sent, before the request timeout", err, time.Since(start))
	}
	up.Store(true)
	time.Sleep(5 * noServerPause) // a resend would go now
	if n.Load() != 1 {
		t.Fatalf("sent %d times; want once", n.Load())
	}
}

// In an outage that has lasted (no answer from the server for longer
// than sessionWait), a request dropped unsent reports the outage at once,
// as go-zookeeper gave it, without waiting for a session.
func TestCall_OutageThatHasLasted_DropReportedAtOnce(t *testing.T) {
	b := &backend{timeout: time.Hour}
	b.hooks.Store(&testHooks{hasSession: func() bool { return false }})
	var n atomic.Int32
	start := time.Now()
	_, err := call(context.Background(), b, "test", func() (int, error) {
		n.Add(1)
		return 0, zk.ErrNoServer
	})
	if !errors.Is(err, dlock.ErrTransient) || n.Load() != 1 || time.Since(start) >= sessionWait {
		t.Fatalf("call in a lasting outage: %v after %v, %d sends; want transient at once, one send", err, time.Since(start), n.Load())
	}
}
