package dlocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// The fault cases of the primitives: a reader or permit holder behind a
// stalled link loses first, a lost reply leaves no reader or permit
// behind, and a waiting writer whose link stalls stops keeping readers
// out.
func testModeFaults(t *testing.T, h Harness, f *Faults) {
	modes := []struct {
		name string
		opt  dlock.Option
		// next is what another client asks for to take the holder's place.
		next []dlock.Option
	}{
		{"Shared", dlock.WithShared(), nil},
		{"Limited", dlock.WithLimit(1), []dlock.Option{dlock.WithLimit(1)}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if !supports(t, h, m.opt) {
				return
			}
			t.Run("StalledHolderLosesFirst", func(t *testing.T) {
				l, link := faulty(t, f)
				key := Key(t)
				holder := mustAcquire(t, l, key, dlock.WithTTL(f.TTL), m.opt)
				link.Stall()
				lk := AcquireWhenFree(t, h.New(t), key, holder, m.next...)
				defer release(t, lk)
				if !errors.Is(holder.Err(), dlock.ErrLockLost) {
					t.Fatalf("holder Err() = %v, want ErrLockLost", holder.Err())
				}
				if lk.Token() <= holder.Token() {
					t.Fatalf("token %d after %d", lk.Token(), holder.Token())
				}
			})
			t.Run("LostReplyOnAcquire", func(t *testing.T) {
				l, link := faulty(t, f)
				key := Key(t)
				warm := mustAcquire(t, l, Key(t), dlock.WithTTL(time.Minute), m.opt)
				release(t, warm)
				link.LoseNextReply()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				lk, err := l.Acquire(ctx, key, dlock.WithTTL(time.Minute), m.opt)
				link.Heal()
				if err == nil {
					t.Logf("acquired despite the lost reply (token %d)", lk.Token())
					assertHeld(t, h.New(t), key)
					release(t, lk)
				} else if errors.Is(err, dlock.ErrNotAcquired) {
					t.Fatalf("a lost reply reported as a held key (the client's own lease?): %v", err)
				}
				// No minute-long reader or permit left behind: a writer
				// gets the key.
				w := mustAcquire(t, h.New(t), key)
				release(t, w)
			})
		})
	}
	t.Run("WaitingWriterStalled", func(t *testing.T) {
		if !supports(t, h, dlock.WithShared()) {
			return
		}
		key := Key(t)
		r := mustAcquire(t, h.New(t), key, dlock.WithShared())
		defer release(t, r)
		l, link := faulty(t, f)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		wch := acquireAsync(ctx, l, key, dlock.WithTTL(f.TTL))
		probe := h.New(t)
		writerWaiting(t, probe, key)
		link.Stall()
		// The writer can neither renew its place nor leave: it must stop
		// keeping readers out within its TTL (session backends: its
		// session's), not for ever.
		r2 := mustAcquire(t, probe, key, dlock.WithShared(), dlock.WithWait(HangTimeout))
		release(t, r2)
		cancel()
		link.Heal()
		if a := <-wch; a.err == nil {
			release(t, a.lk)
		}
	})
}
