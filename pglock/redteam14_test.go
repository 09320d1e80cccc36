package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// Red team, issue 14: every mode at once on one key, on short leases that
// are renewed while held (each renewal bumps the key row's gen and races
// the grants), blocking Acquires (waiting writers register and leave) and
// TryAcquires, direct and through PgBouncer together on one table. At each
// grant, the holders still valid by their own local deadline (which comes
// before their rows expire on the server) must be compatible with the new
// one, and its token above every earlier exclusive holder's and, for an
// exclusive grant, every earlier holder's.
func TestRedTeam14_ModesWithRenewals(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	key := dlocktest.Key(t)
	const workers, limit = 6, 2
	type held struct {
		lk   *dlock.Lock
		mode int
		done bool
	}
	var (
		mu       sync.Mutex
		cur      []*held
		maxTok   uint64 // highest token granted so far
		maxExcl  uint64 // highest exclusive token granted so far
		problems []string
		grants   [3]int
		wg       sync.WaitGroup
	)
	grant := func(lk *dlock.Lock, m int) *held {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		var in [3]int
		live := cur[:0]
		for _, h := range cur {
			if h.done || !now.Before(h.lk.Deadline()) {
				continue
			}
			live = append(live, h)
			in[h.mode]++
		}
		cur = live
		in[m]++
		switch {
		case in[0] > 1, in[0] == 1 && in[1]+in[2] > 0:
			problems = append(problems, fmt.Sprintf("exclusive with others: %v (token %d)", in, lk.Token()))
		case in[1] > 0 && in[2] > 0:
			problems = append(problems, fmt.Sprintf("shared and limited together: %v (token %d)", in, lk.Token()))
		case in[2] > limit:
			problems = append(problems, fmt.Sprintf("%d permits of %d (token %d)", in[2], limit, lk.Token()))
		}
		if lk.Token() <= maxExcl || (m == 0 && lk.Token() <= maxTok) {
			problems = append(problems, fmt.Sprintf("mode %d token %d not above earlier tokens (max %d, exclusive %d)", m, lk.Token(), maxTok, maxExcl))
		}
		maxTok = max(maxTok, lk.Token())
		if m == 0 {
			maxExcl = max(maxExcl, lk.Token())
		}
		grants[m]++
		h := &held{lk: lk, mode: m}
		cur = append(cur, h)
		return h
	}
	modeOpts := [][]dlock.Option{nil, {dlock.WithShared()}, {dlock.WithLimit(limit)}}
	stop := time.Now().Add(2 * time.Second)
	errs := make(chan error, workers)
	for w := range workers {
		dsn := pg.DSN("")
		if w%2 == 1 {
			dsn = pb.DSN("")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := pglock.New(newPool(t, dsn))
			rng := rand.New(rand.NewPCG(uint64(w), 14))
			for time.Now().Before(stop) {
				m := rng.IntN(3)
				opts := append([]dlock.Option{dlock.WithTTL(300 * time.Millisecond)}, modeOpts[m]...)
				var (
					lk  *dlock.Lock
					err error
				)
				if rng.IntN(2) == 0 {
					lk, err = l.TryAcquire(dlocktest.Context(t), key, opts...)
				} else {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+rng.IntN(250))*time.Millisecond)
					lk, err = l.Acquire(ctx, key, opts...)
					cancel()
				}
				if err != nil {
					if errors.Is(err, dlock.ErrNotAcquired) || errors.Is(err, dlock.ErrTransient) ||
						errors.Is(err, context.DeadlineExceeded) {
						continue
					}
					errs <- err
					return
				}
				h := grant(lk, m)
				select {
				case <-lk.Lost():
				case <-time.After(time.Duration(rng.IntN(250)) * time.Millisecond):
				}
				mu.Lock()
				h.done = true
				mu.Unlock()
				_ = lk.Release(dlocktest.Context(t))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("grants: exclusive %d, shared %d, limited %d", grants[0], grants[1], grants[2])
}

// A semaphore whose every holder expired is free: a request with another
// limit sets the limit afresh instead of failing with ErrLimitMismatch; a
// live holder makes it a mismatch naming both limits, also when the
// semaphore is full; an exclusive holder or shared holders make any limit a
// plain refusal (the key is not a semaphore).
func TestRedTeam14_LimitMismatchEdges(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	key := dlocktest.Key(t)
	raw := func(mode driver.Mode, limit int, ttl time.Duration) {
		t.Helper()
		req := &driver.Request{Key: key, Owner: dlock.NewOwner(), TTL: ttl, Metadata: map[string]string{}, Mode: mode, Limit: limit}
		if _, _, err := pglock.TryRaw(ctx, l, req); err != nil {
			t.Fatalf("%s %d: %v", mode, limit, err)
		}
	}
	raw(driver.Limited, 1, 200*time.Millisecond) // dies
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(3)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("limit 3 over a live holder of limit 1: %v, want ErrLimitMismatch", err)
	} else if !strings.Contains(err.Error(), "1") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("mismatch does not name both limits: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	p, err := l.TryAcquire(ctx, key, dlock.WithLimit(dlock.MaxLimit))
	if err != nil {
		t.Fatalf("limit MaxLimit after the last holder expired: %v", err)
	}
	infos, err := l.List(ctx, key)
	if err != nil || len(infos) != 1 || infos[0].Limit != dlock.MaxLimit || infos[0].Mode != dlock.Limited || len(infos[0].Holders) != 1 {
		t.Fatalf("List: %+v %v, want one limited holder, limit %d", infos, err, dlock.MaxLimit)
	}
	mustRelease(t, p)

	// Full semaphore of 1: same limit is refused, another is a mismatch.
	raw(driver.Limited, 1, time.Minute)
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(1)); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("full semaphore: %v, want ErrNotAcquired", err)
	}
	if _, err := l.TryAcquire(ctx, key, dlock.WithLimit(2)); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("full semaphore, other limit: %v, want ErrLimitMismatch", err)
	}

	for _, mode := range []driver.Mode{driver.Exclusive, driver.Shared} {
		k2 := dlocktest.Key(t) + "/" + mode.String()
		req := &driver.Request{Key: k2, Owner: dlock.NewOwner(), TTL: time.Minute, Metadata: map[string]string{}, Mode: mode}
		if _, _, err := pglock.TryRaw(ctx, l, req); err != nil {
			t.Fatal(err)
		}
		_, err := l.TryAcquire(ctx, k2, dlock.WithLimit(1))
		if errors.Is(err, dlock.ErrLimitMismatch) || !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("limited over %s holder: %v, want a plain refusal", mode, err)
		}
	}
}

// Writer preference as the documented least-privilege role: a waiting
// writer registers (INSERT, UPDATE on the writers table), keeps a new
// reader out, and its Leave (DELETE) lets readers in at once; renewing a
// reader locks the key's row (UPDATE on the lease table).
func TestRedTeam14_WriterPreferenceLeastPrivilege(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app14 LOGIN PASSWORD 'pw'",
		"GRANT SELECT, INSERT, UPDATE ON " + pglock.DefaultTable + " TO app14",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + pglock.DefaultTable + "_holders, " + pglock.DefaultTable + "_writers TO app14",
		"GRANT USAGE ON SEQUENCE " + pglock.DefaultTable + "_token_seq TO app14",
		"GRANT SELECT ON " + pglock.MigrationsTable + " TO app14",
	} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	app := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app14:pw@", 1)
	newL := func() *pglock.Locker { return pglock.New(newPool(t, app)) }
	key := dlocktest.Key(t)
	// r1's TTL is well above a renewal's round trip on a loaded machine.
	const ttl = 2 * time.Second
	r1 := mustLock(t, newL(), key, dlock.WithShared(), dlock.WithTTL(ttl))
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan error, 1)
	go func() {
		_, err := newL().Acquire(wctx, key, dlock.WithTTL(time.Minute))
		wdone <- err
	}()
	// The writer's registration keeps the next reader out.
	reader := newL()
	deadline := time.Now().Add(5 * time.Second)
	for {
		lk, err := reader.TryAcquire(dlocktest.Context(t), key, dlock.WithShared())
		if errors.Is(err, dlock.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, lk)
		if time.Now().After(deadline) {
			t.Fatal("a waiting writer never kept a reader out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(ttl + ttl/4) // r1 renewed past its TTL
	select {
	case <-r1.Lost():
		t.Fatalf("reader lost while renewed by the least-privilege role: %v", r1.Err())
	default:
	}
	wcancel()
	if err := <-wdone; err == nil {
		t.Fatal("writer acquired while the reader held")
	}
	// Leave runs in the background: the reader gets in well before the
	// registration's minute.
	lk := mustLock(t, reader, key, dlock.WithShared(), dlock.WithWait(10*time.Second))
	mustRelease(t, lk)
	mustRelease(t, r1)
}

// A shared or limited release whose reply is lost fails, leaves the row
// released on the server (the permit is free at once, not a TTL later),
// and its retry succeeds without freeing anything else; a permit whose
// renewal reply is lost is never doubled.
func TestRedTeam14_LostReplyOnSharedRelease(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	proxy := testserver.StartProxy(t, pg.Addr())
	faulty := pglock.New(newPool(t, pg.ViaProxy(proxy.Addr())),
		pglock.WithRequestTimeout(2*time.Second), pglock.WithoutListen())
	other := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(1)} {
		key := dlocktest.Key(t)
		lk := mustLock(t, faulty, key, opt, dlock.WithTTL(time.Minute))
		proxy.LoseNextReply()
		err := lk.Release(ctx)
		proxy.Heal()
		t.Logf("release with a lost reply: %v", err)
		// Free at once: an exclusive TryAcquire gets it.
		w, err2 := other.TryAcquire(ctx, key)
		if err2 != nil {
			t.Fatalf("writer after a release whose reply was lost: %v (release: %v)", err2, err)
		}
		if err != nil {
			if err := lk.Release(ctx); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("retried release: %v", err)
			}
		}
		mustRelease(t, w)
	}
	// Renewal reply lost: the permit holder keeps or loses its lock, but
	// a second permit is never granted while it holds.
	key := dlocktest.Key(t)
	lk := mustLock(t, faulty, key, dlock.WithLimit(1), dlock.WithTTL(400*time.Millisecond))
	proxy.LoseNextReply()
	end := time.Now().Add(time.Second)
	for time.Now().Before(end) {
		p, err := other.TryAcquire(ctx, key, dlock.WithLimit(1))
		if err == nil {
			if time.Now().Before(lk.Deadline()) {
				t.Fatalf("second permit (token %d) while the first (token %d) is valid", p.Token(), lk.Token())
			}
			mustRelease(t, p)
			break
		}
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Heal()
	_ = lk.Release(ctx)
}

// Hierarchical keys never contend, whatever their modes: a, a/b and a/b/c
// are three keys; List under "a" shows each with its own mode and limit.
func TestRedTeam14_HierarchicalKeysAcrossModes(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	l := pglock.New(newPool(t, pg.DSN("")))
	base := dlocktest.Key(t)
	x := mustLock(t, l, base)
	s := mustLock(t, l, base+"/b", dlock.WithShared())
	p := mustLock(t, l, base+"/b/c", dlock.WithLimit(2))
	for _, k := range []struct {
		key string
		opt []dlock.Option
	}{{base + "/b/c", nil}, {base, []dlock.Option{dlock.WithShared()}}, {base + "/b", []dlock.Option{dlock.WithLimit(1)}}} {
		_, err := l.TryAcquire(ctx, k.key, k.opt...)
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("%s: %v, want its own holder to refuse it", k.key, err)
		}
	}
	infos, err := l.List(ctx, base)
	if err != nil || len(infos) != 3 {
		t.Fatalf("List: %+v %v", infos, err)
	}
	want := []struct {
		mode  dlock.Mode
		limit int
	}{{dlock.Exclusive, 0}, {dlock.Shared, 0}, {dlock.Limited, 2}}
	for i, in := range infos {
		if in.Mode != want[i].mode || in.Limit != want[i].limit || len(in.Holders) != 1 {
			t.Fatalf("List[%d] = %+v, want mode %v limit %d, one holder", i, in, want[i].mode, want[i].limit)
		}
	}
	for _, lk := range []*dlock.Lock{x, s, p} {
		mustRelease(t, lk)
	}
}

// Bad input in the new modes is refused with an error, never a panic, a
// hang or a write: a nil context, limits out of range, shared and limited
// together, keys PostgreSQL's text cannot hold.
func TestRedTeam14_BadInputModes(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	ctx := dlocktest.Context(t)
	pool := newPool(t, pg.DSN(""))
	if err := pglock.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	l := pglock.New(pool)
	key := dlocktest.Key(t)
	cases := []struct {
		name string
		ctx  context.Context
		key  string
		opts []dlock.Option
	}{
		{"nil ctx shared", nil, key, []dlock.Option{dlock.WithShared()}},
		{"nil ctx limited", nil, key, []dlock.Option{dlock.WithLimit(2)}},
		{"limit 0", ctx, key, []dlock.Option{dlock.WithLimit(0)}},
		{"limit -1", ctx, key, []dlock.Option{dlock.WithLimit(-1)}},
		{"limit MaxLimit+1", ctx, key, []dlock.Option{dlock.WithLimit(dlock.MaxLimit + 1)}},
		{"limit huge", ctx, key, []dlock.Option{dlock.WithLimit(1 << 40)}},
		{"shared and limited", ctx, key, []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)}},
		{"NUL key limited", ctx, "a\x00b", []dlock.Option{dlock.WithLimit(2)}},
		{"bad UTF-8 key shared", ctx, "a\xffb", []dlock.Option{dlock.WithShared()}},
	}
	for _, c := range cases {
		for _, try := range []bool{true, false} {
			var err error
			if try {
				_, err = l.TryAcquire(c.ctx, c.key, c.opts...)
			} else {
				_, err = l.Acquire(c.ctx, c.key, append(c.opts, dlock.WithWait(time.Second))...)
			}
			if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
				t.Errorf("%s (try %v): %v, want an input error", c.name, try, err)
			}
		}
	}
	if n, err := pg.Exec("", "SELECT count(*) FROM dlock_leases_holders"); err != nil || n != "0" {
		t.Fatalf("holder rows after bad input: %s %v", n, err)
	}
}
