package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A redis spec carries an optional ACL user; go-redis's options are
// otherwise its defaults.
func TestRedisOptions(t *testing.T) {
	for _, tc := range []struct{ arg, addr, user, password string }{
		{"127.0.0.1:6379", "127.0.0.1:6379", "", ""},
		{"app:pw@127.0.0.1:6379", "127.0.0.1:6379", "app", "pw"},
		{"app:p@ss:w@127.0.0.1:6379", "127.0.0.1:6379", "app", "p@ss:w"}, // the last @ ends the password
		{"app:@127.0.0.1:6379", "127.0.0.1:6379", "app", ""},
	} {
		o, err := redisOptions("redis:"+tc.arg, tc.arg)
		if err != nil {
			t.Errorf("redisOptions(%q): %v", tc.arg, err)
			continue
		}
		if o.Addr != tc.addr || o.Username != tc.user || o.Password != tc.password {
			t.Errorf("redisOptions(%q) = addr %q user %q password %q", tc.arg, o.Addr, o.Username, o.Password)
		}
	}
	for _, arg := range []string{
		"127.0.0.1",          // no port
		"pw@127.0.0.1:6379",  // no user
		":pw@127.0.0.1:6379", // an empty one
		"app:pw@",            // no address
	} {
		if _, _, err := openLocker("redis:" + arg); err == nil || !strings.Contains(err.Error(), "redis spec") {
			t.Errorf("openLocker(redis:%s) = %v, want an error naming the redis spec", arg, err)
		}
	}
}

// requireTairString skips (fails under CI) a test of the redis-tair rows
// where the TairString module is not available.
func requireTairString(t *testing.T) {
	t.Helper()
	testserver.TairStringModule(t)
}

// The redis-tair deployment's workers lock as the no-scripts user (so on
// the Lua-free protocol), and still do after a restart (restart-volatile):
// the server has the user again.
func TestRedisTairDeployment(t *testing.T) {
	requireTairString(t)
	h := &tb{root: t.TempDir()}
	defer h.close()
	const workers = 2
	d := deploy(h, caseSpec{backend: "redis-tair", fault: "restart-volatile", ttl: time.Second}, workers)
	if len(d.specs) != workers || len(d.redis) != 1 || !d.noScriptsUser {
		t.Fatalf("specs %q, %d servers", d.specs, len(d.redis))
	}
	lockAs := func(spec string) {
		t.Helper()
		l, closeLocker, err := openLocker(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer closeLocker()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lk, err := l.TryAcquire(ctx, "safety/tair-spec", dlock.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("%s: TryAcquire: %v", spec, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("%s: Release: %v", spec, err)
		}
	}
	for _, spec := range d.specs {
		if !strings.Contains(spec, testserver.NoScriptsUser+":") {
			t.Fatalf("spec %q does not connect as %s", spec, testserver.NoScriptsUser)
		}
		lockAs(spec)
	}
	d.restartRedis(h)
	lockAs(d.specs[0])
}

// The redis-tair rows end to end, short. The exclusive row passes the
// run's own rules (the control sees the paused holder's damage, the
// fenced register none) with no token regression; the shared and limited
// rows run the same way, or are skipped, not failed, naming the mode the
// Lua-free protocol refuses.
func TestRedisTairRows(t *testing.T) {
	requireTairString(t)
	for _, backend := range []string{"redis-tair", "redis-tair-rw", "redis-tair-sem"} {
		c := caseSpec{backend: backend, fault: "client-pause", ttl: 500 * time.Millisecond, dur: 8 * time.Second, pauses: 3}
		r := runCase(c, 4, 1)
		t.Logf("%s: %s", c.name(), r.summary())
		if r.err != "" {
			t.Fatalf("%s: %s", c.name(), r.err)
		}
		if r.skipped != "" {
			if backend == "redis-tair" || !strings.Contains(r.skipped, "locks refused: ") {
				t.Errorf("%s skipped: %s", c.name(), r.skipped)
			}
			md := (report{results: []caseResult{r}}).markdown()
			if !strings.Contains(md, "| "+backend+" | client-pause | skipped: ") {
				t.Errorf("%s: no skipped row in\n%s", c.name(), md)
			}
			continue
		}
		if ps := (report{results: []caseResult{r}}).problems(); len(ps) != 0 {
			t.Errorf("%s: %s", c.name(), strings.Join(ps, "; "))
		}
		if a := r.analyze(); a.TokenRegressions != 0 {
			t.Errorf("%s: %d token regressions: %v", c.name(), a.TokenRegressions, a.Examples)
		}
	}
}
