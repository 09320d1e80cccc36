package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/safety/history"
)

func TestPrimitiveCases(t *testing.T) {
	for _, tc := range []struct {
		backend, prim, base string
		modes               []string // of workers 0..3
	}{
		{"redis", "", "redis", []string{"exclusive", "exclusive", "exclusive", "exclusive"}},
		{"redis-aof", "", "redis-aof", []string{"exclusive", "exclusive", "exclusive", "exclusive"}},
		{"redis-rw", "rw", "redis", []string{"exclusive", "shared", "exclusive", "shared"}},
		{"redis-sem", "sem", "redis", []string{"limited", "limited", "limited", "limited"}},
		{"redis-tair", "", "redis-tair", []string{"exclusive", "exclusive", "exclusive", "exclusive"}},
		{"redis-tair-rw", "rw", "redis-tair", []string{"exclusive", "shared", "exclusive", "shared"}},
		{"redis-tair-sem", "sem", "redis-tair", []string{"limited", "limited", "limited", "limited"}},
	} {
		c := caseSpec{backend: tc.backend, fault: "client-pause"}
		if c.prim() != tc.prim || c.base() != tc.base {
			t.Errorf("%s: prim %q base %q, want %q %q", tc.backend, c.prim(), c.base(), tc.prim, tc.base)
		}
		for id, want := range tc.modes {
			m, lim := c.workerMode(id)
			if m != want || (m == "limited") != (lim == semPermits) {
				t.Errorf("%s worker %d: mode %s limit %d, want %s", tc.backend, id, m, lim, want)
			}
		}
	}
	// Every primitive row's backend deploys as its base.
	for _, c := range allCases() {
		if c.prim() != "" && c.base() != "redis" && c.base() != "etcd" && c.base() != "redis-tair" {
			t.Errorf("%s: unexpected base %q", c.name(), c.base())
		}
	}
}

// Only the redis-tair rows may be skipped for a mode their backend does
// not offer: anywhere else a refused mode is the case's error, and no
// probe runs.
func TestMayLackModes(t *testing.T) {
	for _, c := range allCases() {
		if got, want := mayLackModes(c.base()), c.base() == "redis-tair"; got != want {
			t.Errorf("%s: mayLackModes = %v, want %v", c.name(), got, want)
		}
		if c.base() != "redis-tair" {
			h := &tb{root: t.TempDir()}
			if why := unsupportedMode(h, c, []string{"redis:127.0.0.1:1", "redis:127.0.0.1:1"}); why != "" {
				t.Errorf("%s: skipped without a probe: %s", c.name(), why)
			}
			h.close()
		}
	}
}

// semHistory is a semaphore row's history: 4 workers, limit semPermits,
// each entering at 100 ns intervals for 250 ns (at most 3 inside), or
// for 150 ns if within (at most 2 inside).
func semHistory(within bool) []history.Event {
	var evs []history.Event
	hold := int64(250)
	if within {
		hold = 150
	}
	for i := range 20 {
		w, t0 := i%4, int64(100*i)
		evs = append(evs,
			history.Event{Worker: w, Key: "k", Op: history.OpAcquire, Result: history.OK, Token: uint64(i + 1), T0: t0, T1: t0 + 1, Shared: true, Limit: semPermits},
			history.Event{Worker: w, Key: "k", Op: history.OpRelease, Result: history.OK, Token: uint64(i + 1), T0: t0 + hold, T1: t0 + hold + 1})
	}
	return evs
}

func TestSemRowProblems(t *testing.T) {
	mk := func(fault string, evs []history.Event) report {
		return report{results: []caseResult{{spec: caseSpec{backend: "redis-sem", fault: fault, ttl: time.Second, dur: time.Second}, events: evs, start: 0, end: 3000, injected: 1}}}
	}
	// Holders within the limit: a healthy baseline (no register touched
	// is not "nothing measured"), a blind client-pause row.
	if ps := mk("none", semHistory(true)).problems(); len(ps) != 0 {
		t.Errorf("healthy semaphore baseline failed: %v", ps)
	}
	if ps := mk("client-pause", semHistory(true)).problems(); len(ps) != 1 || !strings.Contains(ps[0], "blind") {
		t.Errorf("a client-pause semaphore row with no holder beyond the limit: %v", ps)
	}
	// Holders beyond the limit: a broken baseline, a client-pause row
	// that saw its fault.
	if ps := mk("none", semHistory(false)).problems(); len(ps) != 1 || !strings.Contains(ps[0], "broken semaphore") {
		t.Errorf("a baseline with holders beyond the limit: %v", ps)
	}
	if ps := mk("client-pause", semHistory(false)).problems(); len(ps) != 0 {
		t.Errorf("a client-pause semaphore row that saw holders beyond the limit failed: %v", ps)
	}
	if ps := mk("none", nil).problems(); len(ps) != 1 || !strings.Contains(ps[0], "nothing was measured") {
		t.Errorf("an empty semaphore row: %v", ps)
	}
	md := mk("client-pause", semHistory(false)).markdown()
	if !strings.Contains(md, "| redis-sem | client-pause | 1 | 20 | ") || !strings.Contains(md, "beyond the limit of 2") || !strings.Contains(md, "most inside 3) | n/a |") {
		t.Errorf("semaphore row:\n%s", md)
	}
}

// requireRedisModes fails the test unless redislock grants Shared and
// Limited locks on the server at addr.
func requireRedisModes(t *testing.T, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(semPermits)} {
		lk, err := redislock.New(c).TryAcquire(ctx, "safety/probe", opt)
		if err != nil {
			t.Fatalf("redislock refused a shared or limited lock the rw and sem rows need: %v", err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The rw and sem rows end to end, short: real worker processes on a real
// redis-server, writers (rw) or permit holders (sem) paused past their
// TTL. The run's own rules (problems) must hold: the rw row's control
// sees the paused writer's damage and the fenced register none; the sem
// row sees a holder beyond the limit.
func TestPrimitiveRowsRedis(t *testing.T) {
	requireRedisModes(t, testserver.StartRedis(t).Addr())
	for _, backend := range []string{"redis-rw", "redis-sem"} {
		c := caseSpec{backend: backend, fault: "client-pause", ttl: 500 * time.Millisecond, dur: 8 * time.Second, pauses: 3}
		r := runCase(c, 4, 1)
		if r.err != "" {
			t.Fatalf("%s: %s", c.name(), r.err)
		}
		a := r.analyze()
		t.Logf("%s: %s", c.name(), r.summary())
		if ps := (report{results: []caseResult{r}}).problems(); len(ps) != 0 {
			t.Errorf("%s: %s", c.name(), strings.Join(ps, "; "))
		}
		if a.TokenRegressions != 0 {
			t.Errorf("%s: %d token regressions: %v", c.name(), a.TokenRegressions, a.Examples)
		}
		if backend == "redis-rw" {
			shared := 0
			for _, e := range r.events {
				if e.Op == history.OpAcquire && e.Result == history.OK && e.Shared {
					shared++
				}
			}
			if shared == 0 || a.Fenced.Accepted == 0 {
				t.Errorf("%s: %d read locks, %d writes applied: a side never worked", c.name(), shared, a.Fenced.Accepted)
			}
		}
	}
}
