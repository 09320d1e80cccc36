package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Break: an operator's dlock.Break. A forced break frees the key for the
// next acquirer, whose token is higher; the broken holder finds out at its
// next renewal at the latest (at once where the backend can tell:
// Harness.TellsBroken, NoticesDeletion) and its Release reports the loss; an
// owner-checked break with the wrong owner fails with ErrNotHolder naming
// the real holder and changes nothing; breaking a free key removes
// nothing and is not an error; a waiter is woken by a break; among shared
// or counted holders, one owner can be broken alone.
func testBreak(t *testing.T, h Harness) {
	if _, ok := h.New(t).(dlock.Breaker); !ok {
		t.Skip("the Locker does not implement dlock.Breaker")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"Force", testBreakForce},
		{"LostAtNextRenewal", testBreakLostAtRenewal},
		{"TellsHolder", testBreakTellsHolder},
		{"TellsSharedHolder", testBreakTellsSharedHolder},
		{"WrongOwner", testBreakWrongOwner},
		{"Owner", testBreakOwner},
		{"FreeKey", testBreakFree},
		{"WakesWaiter", testBreakWakes},
		{"Shared", func(t *testing.T, h Harness) { testBreakGroup(t, h, dlock.WithShared(), 3) }},
		{"Limited", func(t *testing.T, h Harness) { testBreakGroup(t, h, dlock.WithLimit(3), 3) }},
		{"BadInput", testBreakBadInput},
		{"LeavesChildAndParentKeysAlone", testBreakLeavesChildAndParentKeys},
		{"OwnerIsCaseInsensitive", testBreakOwnerCaseInsensitive},
		{"RacingReleaseOneWins", testBreakRacingRelease},
		{"OwnerCheckedSparesNextHolder", testBreakOwnerSparesNextHolder},
		{"OneReaderKeepsWriterWaiting", testBreakReaderKeepsWriterWaiting},
		{"OnePermitAdmitsWaiter", testBreakPermitAdmitsWaiter},
		{"LeavesWaiters", testBreakLeavesWaiters},
		{"RenewalDoesNotRevive", testBreakRacingRenewal},
		{"OddKeysBreakAlone", testBreakOddKeys},
		{"ConcurrentBreaksRemoveOnce", testBreakConcurrentBreaks},
		{"NewestSharedHolder", func(t *testing.T, h Harness) { testBreakNewestGroupHolder(t, h, dlock.WithShared()) }},
		{"NewestLimitedHolder", func(t *testing.T, h Harness) { testBreakNewestGroupHolder(t, h, dlock.WithLimit(3)) }},
	}
	if h.Faults != nil && h.Faults.New != nil {
		tests = append(tests, []struct {
			name string
			fn   func(*testing.T, Harness)
		}{
			{"StalledLinkReturnsByDeadline", testBreakStalledLink},
			{"LostReplyNeverReportsFree", testBreakLostReply},
		}...)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// testBreakPaused is BreakAgainstPausedServer, run alone: it pauses the
// server(s) every Locker of the harness shares.
func testBreakPaused(t *testing.T, h Harness) {
	if _, ok := h.New(t).(dlock.Breaker); !ok {
		t.Skip("the Locker does not implement dlock.Breaker")
	}
	testBreakAgainstPausedServer(t, h)
}

func mustBreak(t *testing.T, l dlock.Locker, key, owner string) dlock.Broken {
	t.Helper()
	b, err := dlock.Break(ctxT(t), l, key, owner)
	if err != nil {
		t.Fatalf("Break(%q, owner %q): %v", key, owner, err)
	}
	if b.Key != key {
		t.Errorf("Broken.Key = %q, want %q", b.Key, key)
	}
	return b
}

// wantBroken checks that b names exactly the locks lks (owner and token).
func wantBroken(t *testing.T, b dlock.Broken, lks ...*dlock.Lock) {
	t.Helper()
	if len(b.Holders) != len(lks) {
		t.Fatalf("Break removed %d holders %+v, want %d", len(b.Holders), b.Holders, len(lks))
	}
	for _, lk := range lks {
		found := false
		for _, hd := range b.Holders {
			if hd.Owner == lk.Owner() && hd.Token == lk.Token() {
				found = true
			}
		}
		if !found {
			t.Errorf("Break removed %+v, missing owner %s token %d", b.Holders, lk.Owner(), lk.Token())
		}
	}
}

// lapsed reports whether lk was lost at its local deadline (no renewal
// succeeded in time), not by a server's answer.
func lapsed(lk *dlock.Lock) bool {
	var le *dlock.LostError
	return errors.As(lk.Err(), &le) && le.Reason == dlock.LossDeadline
}

// wantLostByBreak checks that lk finds out: a refresh fails with
// ErrLockLost and Lost() is closed by the time it answers; Release then
// reports the loss too. A refresh may still succeed for a while where
// the holder reads from a server that has not applied the break yet (a
// ZooKeeper follower: reads are ordered per client, not across clients),
// so refreshes are repeated until one fails, within HangTimeout.
func wantLostByBreak(t *testing.T, lk *dlock.Lock) {
	t.Helper()
	deadline := time.Now().Add(HangTimeout)
	for {
		err := lk.Refresh(ctxT(t))
		if errors.Is(err, dlock.ErrLockLost) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("Refresh of a broken lock = %v, want ErrLockLost", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-lk.Lost():
	default:
		t.Fatal("Refresh reported the loss but Lost() is still open")
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason == dlock.LossHoldCap {
		t.Errorf("Err() = %v, want a *LostError for the removed lease", lk.Err())
	}
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
	}
}

// wantIntact checks that lk is still held: a refresh succeeds, Lost() is
// open.
func wantIntact(t *testing.T, lk *dlock.Lock) {
	t.Helper()
	if err := lk.Refresh(ctxT(t)); err != nil {
		t.Fatalf("Refresh of a lock that was not broken: %v", err)
	}
	select {
	case <-lk.Lost():
		t.Fatalf("Lost() closed for a lock that was not broken: %v", lk.Err())
	default:
	}
}

func testBreakForce(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
	b := mustBreak(t, operator, key, "")
	wantBroken(t, b, lk)
	if hd := b.Holders[0]; hd.Mode != dlock.Exclusive {
		t.Errorf("broken holder's mode = %v, want exclusive", hd.Mode)
	}
	next, err := operator.TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("TryAcquire after a forced break: %v", err)
	}
	if next.Token() <= lk.Token() {
		t.Errorf("next holder's token %d, not above the broken holder's %d", next.Token(), lk.Token())
	}
	wantLostByBreak(t, lk)
	wantIntact(t, next) // the broken holder's Release did not touch it
	release(t, next)
}

// LostAtNextRenewal: the watchdog's own renewal notices the break.
func testBreakLostAtRenewal(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(h.TTL))
	wantBroken(t, mustBreak(t, operator, key, ""), lk)
	waitClosed(t, lk.Lost(), "the broken lock's Lost()")
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
	}
}

// breakNoticeTTL is the lease of the TellsHolder cases: long enough that
// the watchdog's first renewal (at a third of it) comes far later than
// any notice, so a loss reported before it was not detected by a renewal.
const breakNoticeTTL = 30 * time.Second

// wantToldOfBreak checks that lk's Lost() closes before its first renewal
// was due (acquired was taken before its Acquire was called, so that
// point is no later than acquired + breakNoticeTTL/3), and that the loss
// was reported by the backend (LossBackend), not by a renewal's answer.
func wantToldOfBreak(t *testing.T, lk *dlock.Lock, acquired time.Time) {
	t.Helper()
	timer := time.NewTimer(time.Until(acquired.Add(breakNoticeTTL / 3)))
	defer timer.Stop()
	select {
	case <-lk.Lost():
	case <-timer.C:
		t.Fatalf("the broken holder's Lost() was still open at its first renewal point (TTL/3 = %v after Acquire): the break did not reach it", breakNoticeTTL/3)
	}
	var le *dlock.LostError
	if !errors.As(lk.Err(), &le) || le.Reason != dlock.LossBackend || !errors.Is(lk.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err() = %v, want a *LostError with reason %q wrapping ErrNotHeld (told by the backend, not found by a renewal)", lk.Err(), dlock.LossBackend)
	}
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
	}
}

// TellsHolder: a forced break closes the broken holder's Lost() at once,
// not at its next renewal (the next holder may already be running).
func testBreakTellsHolder(t *testing.T, h Harness) {
	if !h.NoticesDeletion && !h.TellsBroken {
		t.Skip("the backend learns of a break only at the holder's next renewal (Harness.TellsBroken unset)")
	}
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	acquired := time.Now()
	lk := mustAcquire(t, holder, key, dlock.WithTTL(breakNoticeTTL))
	wantBroken(t, mustBreak(t, operator, key, ""), lk)
	wantToldOfBreak(t, lk, acquired)
}

// TellsSharedHolder: an owner-checked break of one shared holder closes
// that holder's Lost() at once and leaves the other holder's lock alone.
func testBreakTellsSharedHolder(t *testing.T, h Harness) {
	if !h.NoticesDeletion && !h.TellsBroken {
		t.Skip("the backend learns of a break only at the holder's next renewal (Harness.TellsBroken unset)")
	}
	l1, l2, operator := h.New(t), h.New(t), h.New(t)
	key := Key(t)
	acquired := time.Now()
	a, err := l1.Acquire(ctxT(t), key, dlock.WithShared(), dlock.WithTTL(breakNoticeTTL))
	if errors.Is(err, dlock.ErrUnsupported) {
		t.Skip("no shared locks")
	}
	if err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, l2, key, dlock.WithShared(), dlock.WithTTL(breakNoticeTTL))
	defer release(t, b)
	wantBroken(t, mustBreak(t, operator, key, a.Owner()), a)
	wantToldOfBreak(t, a, acquired)
	wantIntact(t, b)
}

func testBreakWrongOwner(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
	defer release(t, lk)
	_, err := dlock.Break(ctxT(t), operator, key, dlock.NewOwner())
	if !errors.Is(err, dlock.ErrNotHolder) {
		t.Fatalf("Break with another owner = %v, want ErrNotHolder", err)
	}
	var ne *dlock.NotHolderError
	if !errors.As(err, &ne) {
		t.Fatalf("Break with another owner = %T %v, want a *NotHolderError", err, err)
	}
	if len(ne.Holders) != 1 || ne.Holders[0].Owner != lk.Owner() || ne.Holders[0].Token != lk.Token() {
		t.Errorf("NotHolderError names %+v, want the holder %s token %d", ne.Holders, lk.Owner(), lk.Token())
	}
	wantIntact(t, lk)
	assertHeld(t, operator, key)
}

func testBreakOwner(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
	wantBroken(t, mustBreak(t, operator, key, lk.Owner()), lk)
	wantLostByBreak(t, lk)
	next, err := operator.TryAcquire(ctxT(t), key)
	if err != nil {
		t.Fatalf("TryAcquire after an owner-checked break: %v", err)
	}
	if next.Token() <= lk.Token() {
		t.Errorf("next holder's token %d, not above the broken holder's %d", next.Token(), lk.Token())
	}
	release(t, next)
}

func testBreakFree(t *testing.T, h Harness) {
	l := h.New(t)
	key := Key(t)
	if b := mustBreak(t, l, key, ""); len(b.Holders) != 0 {
		t.Errorf("forced break of a never-held key removed %+v", b.Holders)
	}
	lk := mustAcquire(t, l, key)
	release(t, lk)
	if b := mustBreak(t, l, key, ""); len(b.Holders) != 0 {
		t.Errorf("forced break of a released key removed %+v", b.Holders)
	}
	_, err := dlock.Break(ctxT(t), l, key, lk.Owner())
	var ne *dlock.NotHolderError
	if !errors.As(err, &ne) || !errors.Is(err, dlock.ErrNotHolder) || len(ne.Holders) != 0 {
		t.Errorf("owner-checked break of a free key = %v, want a *NotHolderError naming nobody", err)
	}
	next := mustAcquire(t, l, key)
	if next.Token() <= lk.Token() {
		t.Errorf("token %d after breaks of a free key, not above the earlier %d", next.Token(), lk.Token())
	}
	release(t, next)
}

// WakesWaiter: the holder's lease outlives the test, so a waiter that gets
// the key was let in by the break.
func testBreakWakes(t *testing.T, h Harness) {
	holder, waiter, operator := h.New(t), h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(4*HangTimeout))
	ch := acquireAsync(ctxT(t), waiter, key)
	time.Sleep(100 * time.Millisecond) // most likely waiting by now; either way it must get the key
	wantBroken(t, mustBreak(t, operator, key, ""), lk)
	next := recv(t, ch, "the waiter's Acquire after a break")
	if next.Token() <= lk.Token() {
		t.Errorf("waiter's token %d, not above the broken holder's %d", next.Token(), lk.Token())
	}
	release(t, next)
	if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
	}
}

// testBreakGroup: n holders of a shared or counted key; one is broken by
// owner and the others stay; then a forced break removes the rest.
func testBreakGroup(t *testing.T, h Harness, opt dlock.Option, n int) {
	if !supports(t, h, opt) {
		return
	}
	operator := h.New(t)
	key := Key(t)
	lks := make([]*dlock.Lock, n)
	for i := range lks {
		lks[i] = mustAcquire(t, h.New(t), key, opt, dlock.WithTTL(time.Minute))
	}
	victim := lks[1]
	b := mustBreak(t, operator, key, victim.Owner())
	wantBroken(t, b, victim)
	if mode := b.Holders[0].Mode; mode == dlock.Exclusive {
		t.Errorf("broken holder's mode = %v, want the group's", mode)
	}
	wantLostByBreak(t, victim)
	rest := []*dlock.Lock{lks[0], lks[2]}
	for _, lk := range rest {
		wantIntact(t, lk)
	}
	// The freed place can be taken again, with a higher token.
	again := mustAcquire(t, h.New(t), key, opt, dlock.WithTTL(time.Minute))
	if again.Token() <= victim.Token() {
		t.Errorf("token %d after the break, not above the broken holder's %d", again.Token(), victim.Token())
	}
	rest = append(rest, again)
	wantBroken(t, mustBreak(t, operator, key, ""), rest...)
	for _, lk := range rest {
		wantLostByBreak(t, lk)
	}
	last := mustAcquire(t, operator, key) // exclusive: nobody left
	if last.Token() <= again.Token() {
		t.Errorf("token %d after the forced break, not above %d", last.Token(), again.Token())
	}
	release(t, last)
}

func testBreakBadInput(t *testing.T, h Harness) {
	l := h.New(t)
	ctx := ctxT(t)
	if _, err := dlock.Break(ctx, l, "", ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Break of an empty key = %v, want ErrInvalidKey", err)
	}
	if _, err := dlock.Break(ctx, l, "a\x00b", ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("Break of a key with NUL = %v, want ErrInvalidKey", err)
	}
	for _, owner := range []string{"x", "not-hex-not-hex-not-hex-not-hex!", "0123456789abcdef0123456789abcdef0"} {
		if _, err := dlock.Break(ctx, l, Key(t), owner); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("Break with owner %q = %v, want ErrInvalidOption", owner, err)
		}
	}
	if _, err := dlock.Break(nil, l, Key(t), ""); err == nil { //nolint:staticcheck // nil context on purpose
		t.Error("Break with a nil context: no error")
	}
	if _, err := dlock.Break(ctx, nil, Key(t), ""); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Break with a nil Locker = %v, want ErrNilClient", err)
	}
	if rt := reflect.TypeOf(l); rt.Kind() == reflect.Pointer {
		// A nil *Locker of the backend: an error, not a panic.
		nilLocker := reflect.Zero(rt).Interface().(dlock.Locker)
		if _, err := dlock.Break(ctx, nilLocker, Key(t), ""); !errors.Is(err, dlock.ErrNilClient) {
			t.Errorf("Break on a nil %v = %v, want ErrNilClient", rt, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := dlock.Break(cctx, l, Key(t), ""); err == nil {
		t.Error("Break with a cancelled context: no error")
	}
}

// LeavesChildAndParentKeysAlone: breaking "k" leaves "k/b", "k/" and "kx" alone.
func testBreakLeavesChildAndParentKeys(t *testing.T, h Harness) {
	l, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, l, key, dlock.WithTTL(time.Minute))
	var others []*dlock.Lock
	for _, k := range []string{key + "/b", key + "/", key + "x", key + "/b/c"} {
		others = append(others, mustAcquire(t, l, k, dlock.WithTTL(time.Minute)))
	}
	wantBroken(t, mustBreak(t, operator, key, ""), lk)
	wantLostByBreak(t, lk)
	for _, o := range others {
		wantIntact(t, o)
		release(t, o)
	}
	// Breaking a child leaves the parent.
	parent := mustAcquire(t, l, key, dlock.WithTTL(time.Minute))
	if b := mustBreak(t, operator, key+"/b", ""); len(b.Holders) != 0 {
		t.Errorf("break of a free child removed %+v", b.Holders)
	}
	wantIntact(t, parent)
	release(t, parent)
}

// OwnerIsCaseInsensitive: an owner id in upper case names the same holder
// (ValidateOwner lowers it); a prefix of the owner id is refused.
func testBreakOwnerCaseInsensitive(t *testing.T, h Harness) {
	l, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, l, key, dlock.WithTTL(time.Minute))
	if _, err := dlock.Break(ctxT(t), operator, key, lk.Owner()[:31]); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Break with a 31-digit owner prefix = %v, want ErrInvalidOption", err)
	}
	wantIntact(t, lk)
	wantBroken(t, mustBreak(t, operator, key, strings.ToUpper(lk.Owner())), lk)
	wantLostByBreak(t, lk)
}

// RacingReleaseOneWins: a forced break and the holder's Release race;
// exactly one of them wins: the break reports the holder and the Release
// the loss, or the Release succeeds and the break finds the key free.
func testBreakRacingRelease(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	for i := 0; i < 8; i++ {
		key := Key(t)
		lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
		var (
			wg     sync.WaitGroup
			b      dlock.Broken
			berr   error
			relErr error
		)
		wg.Add(2)
		go func() { defer wg.Done(); b, berr = dlock.Break(ctxT(t), operator, key, "") }()
		go func() { defer wg.Done(); relErr = lk.Release(ctxT(t)) }()
		wg.Wait()
		if berr != nil {
			t.Fatalf("round %d: Break racing a Release: %v", i, berr)
		}
		broke := len(b.Holders) == 1 && b.Holders[0].Token == lk.Token()
		if len(b.Nodes) > 0 && len(b.Holders) == 1 && b.Holders[0].Owner == lk.Owner() && relErr == nil {
			// A quorum backend, where the race is per node: the Release
			// reached a majority first and the break removed the lease's
			// copies on the rest (or phase-one grants that never got the
			// token, token 0: a straggler's, which the Release was
			// cleaning up too). Both report what they did on the nodes
			// they won; the lock was released, not broken. A known
			// limit of quorum backends, tolerated here.
			t.Logf("round %d: the release won a majority; the break removed %+v on %d node(s)", i, b.Holders, len(b.Nodes))
			broke, b.Holders = false, nil
		}
		switch {
		case broke && relErr == nil:
			t.Fatalf("round %d: the break removed the lease %d (nodes %+v) and its Release reported success", i, lk.Token(), b.Nodes)
		case !broke && len(b.Holders) != 0:
			t.Fatalf("round %d: the break removed %+v (tokens %v, nodes %+v), not the holder's lease %d (release: %v)", i, b.Holders, tokens(b.Holders), b.Nodes, lk.Token(), relErr)
		case !broke && relErr != nil:
			t.Fatalf("round %d: the break found the key free but the Release failed: %v", i, relErr)
		case broke && !errors.Is(relErr, dlock.ErrLockLost):
			t.Fatalf("round %d: Release of a broken lock = %v, want ErrLockLost", i, relErr)
		}
		next := mustAcquire(t, operator, key)
		if next.Token() <= lk.Token() {
			t.Errorf("round %d: token %d after %d", i, next.Token(), lk.Token())
		}
		release(t, next)
	}
}

// OwnerCheckedSparesNextHolder: an owner-checked break of A races A's
// release and another client's acquisition of the key: the new holder is
// never removed.
func testBreakOwnerSparesNextHolder(t *testing.T, h Harness) {
	holder, other, operator := h.New(t), h.New(t), h.New(t)
	for i := 0; i < 8; i++ {
		key := Key(t)
		lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
		var (
			wg   sync.WaitGroup
			b    dlock.Broken
			berr error
			next *dlock.Lock
		)
		wg.Add(2)
		go func() { defer wg.Done(); b, berr = dlock.Break(ctxT(t), operator, key, lk.Owner()) }()
		go func() {
			defer wg.Done()
			_ = lk.Release(ctxT(t))
			next, _ = other.Acquire(ctxT(t), key, dlock.WithTTL(time.Minute))
		}()
		wg.Wait()
		if berr != nil && !errors.Is(berr, dlock.ErrNotHolder) {
			t.Fatalf("round %d: Break: %v", i, berr)
		}
		for _, hd := range b.Holders {
			if hd.Owner != lk.Owner() {
				t.Fatalf("round %d: an owner-checked break of %s removed %+v", i, lk.Owner(), hd)
			}
		}
		if next == nil {
			t.Fatalf("round %d: the other client did not get the key", i)
		}
		wantIntact(t, next)
		release(t, next)
	}
}

// OneReaderKeepsWriterWaiting: readers hold the key and a writer waits;
// breaking one reader keeps the writer waiting (the other reader still
// holds), a forced break lets it in, with a higher token.
func testBreakReaderKeepsWriterWaiting(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithShared()) {
		return
	}
	operator := h.New(t)
	key := Key(t)
	r1 := mustAcquire(t, h.New(t), key, dlock.WithShared(), dlock.WithTTL(4*HangTimeout))
	r2 := mustAcquire(t, h.New(t), key, dlock.WithShared(), dlock.WithTTL(4*HangTimeout))
	ch := acquireAsync(ctxT(t), h.New(t), key)
	time.Sleep(100 * time.Millisecond)
	wantBroken(t, mustBreak(t, operator, key, r1.Owner()), r1)
	select {
	case a := <-ch:
		if a.err == nil {
			a.lk.Release(context.Background())
		}
		t.Fatalf("the writer got the key (%v) while reader %s still holds it", a.err, r2.Owner())
	case <-time.After(200 * time.Millisecond):
	}
	wantIntact(t, r2)
	wantBroken(t, mustBreak(t, operator, key, ""), r2)
	w := recv(t, ch, "the waiting writer after a forced break")
	if w.Token() <= r2.Token() || w.Token() <= r1.Token() {
		t.Errorf("writer's token %d, not above the broken readers' %d, %d", w.Token(), r1.Token(), r2.Token())
	}
	release(t, w)
	for _, r := range []*dlock.Lock{r1, r2} {
		if err := r.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
			t.Errorf("Release of a broken reader = %v, want ErrLockLost", err)
		}
	}
}

// OnePermitAdmitsWaiter: a full semaphore and a waiter for a permit;
// breaking one holder by owner lets the waiter in.
func testBreakPermitAdmitsWaiter(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithLimit(2)) {
		return
	}
	operator := h.New(t)
	key := Key(t)
	a := mustAcquire(t, h.New(t), key, dlock.WithLimit(2), dlock.WithTTL(4*HangTimeout))
	b := mustAcquire(t, h.New(t), key, dlock.WithLimit(2), dlock.WithTTL(4*HangTimeout))
	ch := acquireAsync(ctxT(t), h.New(t), key, dlock.WithLimit(2))
	time.Sleep(100 * time.Millisecond)
	wantBroken(t, mustBreak(t, operator, key, a.Owner()), a)
	c := recv(t, ch, "the semaphore's waiter after a break of one holder")
	if c.Token() <= a.Token() {
		t.Errorf("waiter's token %d, not above the broken holder's %d", c.Token(), a.Token())
	}
	wantIntact(t, b)
	release(t, c)
	release(t, b)
	if err := a.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of a broken holder = %v, want ErrLockLost", err)
	}
}

// StalledLinkReturnsByDeadline: a Break whose link is stalled returns by its
// context's deadline with an error that is neither a removal report nor
// ErrNotHolder; once healed, the lock is still held or broken, never both
// reported.
func testBreakStalledLink(t *testing.T, h Harness) {
	l, link := faulty(t, h.Faults)
	key := Key(t)
	holder := mustAcquire(t, h.New(t), key, dlock.WithTTL(time.Minute))
	// Warm the link: the stall must catch the break, not a dial.
	if _, err := dlock.Break(ctxT(t), l, Key(t), ""); err != nil {
		t.Fatalf("warm-up Break: %v", err)
	}
	link.Stall()
	err := bounded(t, "Break over a stalled link", time.Second, func(ctx context.Context) error {
		b, err := dlock.Break(ctx, l, key, holder.Owner())
		if err == nil {
			t.Errorf("Break over a stalled link reported %+v", b.Holders)
		}
		return err
	})
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotHolder) {
		t.Fatalf("Break over a stalled link = %v, want ErrUnavailable", err)
	}
	link.Heal()
	// A retry is harmless: it breaks the lock, or finds it broken.
	var b dlock.Broken
	for end := time.Now().Add(HangTimeout); ; {
		b, err = dlock.Break(ctxT(t), l, key, "")
		if err == nil || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Break after healing: %v", err)
	}
	for _, hd := range b.Holders {
		if hd.Owner != holder.Owner() {
			t.Fatalf("retried break removed %+v, not the holder", hd)
		}
	}
	wantLostByBreak(t, holder)
	next := mustAcquire(t, h.New(t), key)
	if next.Token() <= holder.Token() {
		t.Errorf("token %d after the broken %d", next.Token(), holder.Token())
	}
	release(t, next)
}

// LostReplyNeverReportsFree: the reply to a Break's request is lost (the
// request took effect): Break reports the holder it removed, or an error
// (then a retry breaks the lock or finds it broken); never success with
// nothing removed ("the key was free") nor ErrNotHolder for the owner it
// just broke.
func testBreakLostReply(t *testing.T, h Harness) {
	for _, byOwner := range []bool{false, true} {
		l, link := faulty(t, h.Faults)
		key := Key(t)
		holder := mustAcquire(t, h.New(t), key, dlock.WithTTL(time.Minute))
		if _, err := dlock.Break(ctxT(t), l, Key(t), ""); err != nil {
			t.Fatalf("warm-up Break: %v", err)
		}
		owner := ""
		if byOwner {
			owner = holder.Owner()
		}
		link.LoseNextReply()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		b, err := dlock.Break(ctx, l, key, owner)
		cancel()
		link.Heal()
		t.Logf("owner %q: Break with a lost reply: %+v, %v", owner, b.Holders, err)
		switch {
		case errors.Is(err, dlock.ErrNotHolder):
			t.Errorf("owner %q: a lost reply reported as ErrNotHolder (the break's own removal?): %v", owner, err)
		case err == nil && len(b.Holders) == 0:
			t.Errorf("owner %q: a lost reply reported as a free key: the break removed the holder %s", owner, holder.Owner())
		case err == nil && (len(b.Holders) != 1 || b.Holders[0].Owner != holder.Owner()):
			t.Errorf("owner %q: Break removed %+v, want the holder", owner, b.Holders)
		case err != nil:
			// The reply lost may have been an earlier step's (a
			// transaction's BEGIN): the operator tries again, which breaks
			// the lock or finds it broken.
			b, err = dlock.Break(ctxT(t), l, key, "")
			if err != nil {
				t.Fatalf("owner %q: Break retried after the lost reply: %v", owner, err)
			}
			for _, hd := range b.Holders {
				if hd.Owner != holder.Owner() {
					t.Fatalf("owner %q: retried break removed %+v, not the holder", owner, hd)
				}
			}
		}
		wantLostByBreak(t, holder)
		next := mustAcquire(t, h.New(t), key)
		if next.Token() <= holder.Token() {
			t.Errorf("token %d after the broken %d", next.Token(), holder.Token())
		}
		release(t, next)
	}
}

func tokens(hs []dlock.Holder) []uint64 {
	var out []uint64
	for _, h := range hs {
		out = append(out, h.Token)
	}
	return out
}

// NewestSharedHolder, NewestLimitedHolder: the group's newest holder (the latest
// token) is broken alone; the others release, an exclusive holder comes
// and goes. The broken holder's Release still reports the loss: no
// release marker or receipt of the others names its token.
func testBreakNewestGroupHolder(t *testing.T, h Harness, opt dlock.Option) {
	if !supports(t, h, opt) {
		return
	}
	operator := h.New(t)
	key := Key(t)
	a := mustAcquire(t, h.New(t), key, opt, dlock.WithTTL(4*HangTimeout))
	b := mustAcquire(t, h.New(t), key, opt, dlock.WithTTL(4*HangTimeout))
	c := mustAcquire(t, h.New(t), key, opt, dlock.WithTTL(4*HangTimeout))
	wantBroken(t, mustBreak(t, operator, key, c.Owner()), c)
	release(t, a)
	release(t, b)
	for i := 0; i < 2; i++ {
		x := mustAcquire(t, operator, key)
		if x.Token() <= c.Token() {
			t.Errorf("token %d after the broken %d", x.Token(), c.Token())
		}
		release(t, x)
	}
	if err := c.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Release of the broken newest group holder = %v, want ErrLockLost", err)
	}
}

// OddKeysBreakAlone: keys that look like the backends' own encodings, a
// leading '}', separators, non-ASCII, the longest allowed: each breaks
// alone.
func testBreakOddKeys(t *testing.T, h Harness) {
	l, operator := h.New(t), h.New(t)
	base := Key(t)
	keys := []string{
		"}" + base, base + "|0|x", "*s|1|0" + base, "|7" + base, base + ":waiters", base + "/../x",
		" " + base + " ", "ключ-" + base, base + "\t", "-" + base,
		strings.Repeat("k", dlock.MaxKeyLen-len(base)) + base,
	}
	var lks []*dlock.Lock
	for _, k := range keys {
		lks = append(lks, mustAcquire(t, l, k, dlock.WithTTL(time.Minute)))
	}
	for i, k := range keys {
		wantBroken(t, mustBreak(t, operator, k, strings.ToUpper(lks[i].Owner())), lks[i])
		wantLostByBreak(t, lks[i])
		for _, o := range lks[i+1:] {
			wantIntact(t, o)
		}
	}
}

// ConcurrentBreaksRemoveOnce: two operators break the same key at once; the
// holder is reported removed once, the other finds the key free.
func testBreakConcurrentBreaks(t *testing.T, h Harness) {
	holder := h.New(t)
	ops := []dlock.Locker{h.New(t), h.New(t)}
	for i := 0; i < 6; i++ {
		key := Key(t)
		lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
		var (
			wg   sync.WaitGroup
			bs   [2]dlock.Broken
			errs [2]error
		)
		for j := range ops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := ""
				if j == 1 {
					owner = lk.Owner()
				}
				bs[j], errs[j] = dlock.Break(ctxT(t), ops[j], key, owner)
			}()
		}
		wg.Wait()
		n := 0
		for j := range ops {
			if errs[j] != nil && !(j == 1 && errors.Is(errs[j], dlock.ErrNotHolder)) {
				t.Fatalf("round %d: Break %d: %v", i, j, errs[j])
			}
			if len(bs[j].Holders) > 0 {
				n++
			}
		}
		if n == 2 && len(bs[0].Nodes) == 0 {
			t.Fatalf("round %d: both breaks report the holder removed: %+v, %+v", i, bs[0].Holders, bs[1].Holders)
		}
		if n == 0 {
			t.Fatalf("round %d: neither break removed the holder", i)
		}
		wantLostByBreak(t, lk)
	}
}

// LeavesWaiters: readers hold, a writer waits, a reader
// waits behind the writer (writer preference). A forced break removes the
// two holding readers only; the writer gets the key, then the waiting
// reader. The reader starts once the writer keeps new readers out
// (writerWaiting), so it can only wait, never hold. Its first attempt has
// been sent when the break runs, not necessarily registered: a break that
// removed a queued reader is caught when the registration was first.
func testBreakLeavesWaiters(t *testing.T, h Harness) {
	if !supports(t, h, dlock.WithShared()) {
		return
	}
	operator := h.New(t)
	key := Key(t)
	r1 := mustAcquire(t, h.New(t), key, dlock.WithShared(), dlock.WithTTL(4*HangTimeout))
	r2 := mustAcquire(t, h.New(t), key, dlock.WithShared(), dlock.WithTTL(4*HangTimeout))
	wch := acquireAsync(ctxT(t), h.New(t), key)
	writerWaiting(t, h.New(t), key)
	sent := make(chan struct{})
	var once sync.Once
	rch := acquireAsync(ctxT(t), h.New(t), key, dlock.WithShared(), dlock.WithCallObserver(dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventAttempt {
			once.Do(func() { close(sent) })
		}
	})))
	waitClosed(t, sent, "the waiting reader's first attempt")
	wantBroken(t, mustBreak(t, operator, key, ""), r1, r2)
	w := recv(t, wch, "the waiting writer after a forced break")
	// The broken readers find out (and stop being renewed: left held,
	// they would outlive the test).
	wantLostByBreak(t, r1)
	wantLostByBreak(t, r2)
	select {
	case a := <-rch:
		if a.err == nil {
			a.lk.Release(context.Background())
		}
		t.Fatalf("the waiting reader got the key (%v) while the writer holds it", a.err)
	default:
	}
	release(t, w)
	r3 := recv(t, rch, "the waiting reader after the writer")
	if r3.Token() <= w.Token() {
		t.Errorf("reader's token %d, not above the writer's %d", r3.Token(), w.Token())
	}
	release(t, r3)
}

// BreakAgainstPausedServer: the server holding the key hangs (SIGSTOP; for
// filelock a stopped process holding the key's file lock): Break returns
// by its context's deadline with an error, not a report; after the
// resume a Break removes the holder or finds it removed.
func testBreakAgainstPausedServer(t *testing.T, h Harness) {
	holder, operator := h.New(t), h.New(t)
	key := Key(t)
	lk := mustAcquire(t, holder, key, dlock.WithTTL(time.Minute))
	mustBreak(t, operator, Key(t), "") // warm the operator's connections
	resume := h.Faults.Pause(t, key)
	resumed := false
	defer func() {
		// A failed check must not leave the servers paused under the
		// tests that run next.
		if !resumed {
			resume()
		}
	}()
	err := bounded(t, "Break against a paused server", time.Second, func(ctx context.Context) error {
		b, err := dlock.Break(ctx, operator, key, "")
		if err == nil {
			t.Errorf("Break against a paused server reported %+v", b.Holders)
		}
		return err
	})
	resume()
	resumed = true
	if !errors.Is(err, dlock.ErrUnavailable) || errors.Is(err, dlock.ErrNotHolder) {
		t.Fatalf("Break against a paused server = %v, want ErrUnavailable", err)
	}
	var b dlock.Broken
	for end := time.Now().Add(HangTimeout); ; {
		b, err = dlock.Break(ctxT(t), operator, key, "")
		if err == nil || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Break after the resume: %v", err)
	}
	for _, hd := range b.Holders {
		if hd.Owner != lk.Owner() {
			t.Fatalf("Break after the resume removed %+v, not the holder", hd)
		}
	}
	wantLostByBreak(t, lk)
}

// RenewalDoesNotRevive: breaks land while the holder's watchdog renews
// a short lease; no renewal brings a broken lease back: the holder loses
// it, and the next holder keeps the key for several of those TTLs.
func testBreakRacingRenewal(t *testing.T, h Harness) {
	operator := h.New(t)
	for i := 0; i < 3; i++ {
		t.Run(fmt.Sprint("Point", i), func(t *testing.T) {
			t.Parallel()
			key := Key(t)
			lk := mustAcquire(t, h.New(t), key, dlock.WithTTL(h.TTL))
			time.Sleep(h.TTL / 3 * time.Duration(i) / 2) // land at different points of the renewal cycle
			if b := mustBreak(t, operator, key, ""); len(b.Holders) == 0 && lapsed(lk) {
				// A starved watchdog let the short lease run out first: the
				// holder knew (its local deadline) and the rest holds.
				t.Logf("the lease ran out before the break: %v", lk.Err())
			} else {
				wantBroken(t, b, lk)
			}
			waitClosed(t, lk.Lost(), "the broken lock's Lost()")
			next := mustAcquire(t, operator, key, dlock.WithTTL(h.TTL))
			t.Cleanup(func() { next.Release(context.Background()) }) // a no-op after the release below
			// The broken lock's Release reports the loss and leaves the next
			// holder's lease alone (wantIntact below).
			if err := lk.Release(context.Background()); !errors.Is(err, dlock.ErrLockLost) {
				t.Errorf("Release of a broken lock = %v, want ErrLockLost", err)
			}
			holdFor(t, next, 2*h.TTL, h.TTL)
			wantIntact(t, next)
			release(t, next)
		})
	}
}
