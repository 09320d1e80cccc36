package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// startTairServer starts the tair group's server as dlockbench does.
func startTairServer(t *testing.T) string {
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	srv.AddNoScriptsUser(t)
	return srv.Addr()
}

// Each tair row takes and releases locks as the user that may not run
// scripts, and a released key can be taken again.
func TestTairLibraries(t *testing.T) {
	addr := startTairServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, l := range tairLibraries(addr) {
		lk, err := l.newLocker()
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		defer lk.close()
		key := uniqueKey("tair")
		for i := 0; i < 2; i++ {
			un, err := lk.lock(ctx, key)
			if err != nil {
				t.Fatalf("%s: lock %d: %v", l.name, i, err)
			}
			if err := un(ctx); err != nil {
				t.Fatalf("%s: unlock %d: %v", l.name, i, err)
			}
		}
	}
}

// The tair floor refuses a held key and releases only its own lease: CAD
// with another owner leaves the key.
func TestTairFloorHeldKey(t *testing.T) {
	addr := startTairServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := &tairFloor{c: tairClient(addr)}
	defer f.close()
	key := uniqueKey("tair")
	un, err := f.lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.lock(ctx, key); err == nil {
		t.Fatal("a second lock of a held key succeeded")
	}
	if n, err := f.c.Do(ctx, "CAD", key, "someone-else").Int(); err != nil || n != 0 {
		t.Fatalf("CAD with another owner: %d, %v", n, err)
	}
	if err := un(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := f.c.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("key after release: exists %d, %v", n, err)
	}
}

// The tair rows are compared with their own floor, in the tables and in
// the group's paragraph.
func TestTairReport(t *testing.T) {
	rep := &report{cfg: config{contenders: 16, contend: time.Second}, errs: map[string]string{},
		libs: []lib{{name: nFloor, group: "redis"}, {name: nDRedis, group: "redis", contended: true}, {name: nTairFloor, group: "tair"}, {name: nDTair, group: "tair", contended: true}, {name: nDTairScripts, group: "tair", contended: true}},
		unc: map[string]uncontendedResult{
			nFloor: {p50: 100 * time.Microsecond}, nDRedis: {p50: 110 * time.Microsecond},
			nTairFloor: {p50: 200 * time.Microsecond}, nDTair: {p50: 300 * time.Microsecond}, nDTairScripts: {p50: 250 * time.Microsecond}},
		thr: map[string]float64{nTairFloor: 4000, nDTair: 3000, nDTairScripts: 6000},
		con: map[string]contendedResult{nDRedis: {handoffsPerS: 1000}, nDTair: {handoffsPerS: 500}, nDTairScripts: {handoffsPerS: 2000}}}
	md := rep.markdown()
	for _, want := range []string{
		"| dlock redislock (Tair, no scripts) | 300 µs | — | 0 | 1.50× | 1.00× |",
		"| floor: SET NX PX + CAD (Tair) | 200 µs | — | 0 | 1.00× | 0.67× |",
		"| dlock redislock | 110 µs | — | 0 | 1.10× | 1.00× |",
		"uncontended p50 1.50×, throughput 0.75×; contended handoffs/s 500. Against the scripts on the same server (the default user): uncontended p50 1.20×, throughput 0.50×, handoffs/s 0.25×.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
