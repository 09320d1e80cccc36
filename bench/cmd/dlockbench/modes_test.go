package main

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

// memModes makes contenders sharing one in-memory lock service (memlock
// implements both modes), taking keys with opts.
func memModes(opts ...dlock.Option) func() (locker, error) {
	l := memlock.New()
	return withMode(func() (locker, error) { return &modeLocker{l: l, close_: func() {}}, nil }, opts...)
}

func TestModeRunSemaphoreKeepsLimit(t *testing.T) {
	r, err := modeRun(memModes(dlock.WithLimit(semLimit)), 16, semLimit, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.acquisitions == 0 || r.unsupported || r.failures != 0 {
		t.Fatalf("semaphore on memlock: %+v", r)
	}
	if r.overLimit != 0 || r.maxInside > semLimit {
		t.Fatalf("semaphore of %d: %d entries beyond the limit, %d inside at once", semLimit, r.overLimit, r.maxInside)
	}
}

// The scenario's own check is not blind: readers are not limited, so with
// limit 1 imposed on a run of shared locks the count of entries beyond it
// shows whenever two readers were inside together, and an exclusive run
// never shows one.
func TestModeRunCountsEntriesBeyondLimit(t *testing.T) {
	r, err := modeRun(memModes(), 8, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.acquisitions == 0 || r.overLimit != 0 || r.maxInside != 1 {
		t.Fatalf("exclusive lock: %+v", r)
	}
	// Two readers are made to be inside together: the first two entries
	// wait for each other (bounded) before they leave.
	var entered atomic.Int32
	both := make(chan struct{})
	insideHook = func() {
		switch entered.Add(1) {
		case 1:
			select {
			case <-both:
			case <-time.After(10 * time.Second):
			}
		case 2:
			close(both)
		}
	}
	defer func() { insideHook = nil }()
	r, err = modeRun(memModes(dlock.WithShared()), 16, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.acquisitions == 0 || r.failures != 0 {
		t.Fatalf("read lock: %+v", r)
	}
	if r.maxInside < 2 || r.overLimit == 0 {
		t.Fatalf("two readers were inside at once; counted %d inside at most and %d entries beyond limit 1", r.maxInside, r.overLimit)
	}
}

// The counter floor on a real server keeps its limit and hands permits on.
func TestCounterSemFloor(t *testing.T) {
	srv := testserver.StartRedis(t)
	r, err := modeRun(func() (locker, error) { return &counterSem{c: redisClient(srv.Addr()), limit: semLimit}, nil }, 16, semLimit, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.acquisitions == 0 || r.failures != 0 || r.overLimit != 0 || r.maxInside > semLimit {
		t.Fatalf("counter floor: %+v (%s)", r, r.firstErr)
	}
}

// redislock in both modes: measured if the backend offers the mode,
// reported as unsupported (not as an error) if it does not.
func TestModeRunRedislock(t *testing.T) {
	srv := testserver.StartRedis(t)
	mk := func() (locker, error) {
		c := redisClient(srv.Addr())
		return &modeLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
	}
	for _, tc := range []struct {
		name  string
		opt   dlock.Option
		limit int
	}{{"shared", dlock.WithShared(), 0}, {"limited", dlock.WithLimit(semLimit), semLimit}} {
		r, err := modeRun(withMode(mk, tc.opt), 16, tc.limit, 500*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.unsupported {
			t.Logf("%s: redislock does not offer the mode", tc.name)
			continue
		}
		if r.acquisitions == 0 || r.failures != 0 || r.overLimit != 0 {
			t.Fatalf("%s: %+v (%s)", tc.name, r, r.firstErr)
		}
	}
}

func TestModesReport(t *testing.T) {
	rep := &report{cfg: config{contenders: 16, contend: time.Second}, con: map[string]contendedResult{nDRedis: {handoffsPerS: 100}}, unc: map[string]uncontendedResult{}, thr: map[string]float64{}, errs: map[string]string{},
		libs: []lib{{name: nDRedis, group: "redis"}}}
	rep.modes = []modeResults{{lib: modeLib{name: nDRedis, group: "redis", exclusive: nDRedis, semFloor: func() (locker, error) { return nil, nil }},
		read:  modeResult{acquisitions: 2000, perS: 2000, contenders: 16, maxInside: 9},
		sem:   modeResult{acquisitions: 300, perS: 300, contenders: 16, limit: semLimit, maxInside: 4},
		floor: modeResult{acquisitions: 600, perS: 600, contenders: 16, limit: semLimit, maxInside: 4}},
		{lib: modeLib{name: nDEtcd, group: "etcd", exclusive: nDEtcd}, read: modeResult{unsupported: true}, sem: modeResult{unsupported: true}}}
	md := rep.markdown()
	for _, want := range []string{
		"| redislock read lock: acquisitions/s with 16 readers ≥ 10× exclusive handoffs/s with 16 contenders | met | 20.00× (2000 vs 100 /s) |",
		"| redislock semaphore (limit 4): never more than 4 holders inside | met |",
		"| dlock redislock | semaphore: Acquire(WithLimit(4)) | 300 | 3.00× | 0.50× | 0 | 300 | 0 |",
		"| floor: Lua permit counter |",
		"| dlock etcdlock | read lock: Acquire(WithShared()) | not supported by this backend |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
