package clock_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sys/unix"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/safety/clock"
)

// shared holds the shim and the probe, built once for the package's tests.
var shared struct {
	once           sync.Once
	dir, so, probe string
	err            error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// build returns the shim's and the probe's paths, building them once.
func build(t *testing.T) (so, probe string) {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "dlock-clock-test-")
		if shared.err != nil {
			return
		}
		if shared.so, shared.err = clock.Build(shared.dir); shared.err != nil {
			return
		}
		shared.probe = filepath.Join(shared.dir, "probe")
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
			if _, err := exec.LookPath(cc); err != nil {
				cc = "gcc"
			}
		}
		out, err := exec.Command(cc, "-Wall", "-Wextra", "-o", shared.probe, "testdata/probe.c").CombinedOutput()
		if err != nil {
			shared.err = fmt.Errorf("compile probe: %v\n%s", err, out)
		}
	})
	if errors.Is(shared.err, clock.ErrNoCompiler) && os.Getenv("CI") == "" {
		t.Skip(shared.err) // as testserver does for a missing server binary
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.so, shared.probe
}

func newOffset(t *testing.T) *clock.Offset {
	t.Helper()
	o, err := clock.NewOffset(filepath.Join(t.TempDir(), "offset"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

func set(t *testing.T, o *clock.Offset, d time.Duration) {
	t.Helper()
	if err := o.Set(d); err != nil {
		t.Fatal(err)
	}
}

func TestBuild(t *testing.T) {
	so, _ := build(t)
	st, err := os.Stat(so)
	if err != nil || st.Size() == 0 {
		t.Fatalf("shim %s: %v", so, err)
	}
	again, err := clock.Build(filepath.Dir(so))
	if err != nil || again != so {
		t.Fatalf("second Build = %q, %v; want %q (reused)", again, err, so)
	}
	entries, _ := os.ReadDir(filepath.Dir(so))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "dlock-clock-build-") {
			t.Errorf("build left %s behind", e.Name())
		}
	}
}

func TestBuildWithoutCompiler(t *testing.T) {
	t.Setenv("CC", "")
	t.Setenv("PATH", t.TempDir())
	_, err := clock.Build(t.TempDir())
	if !errors.Is(err, clock.ErrNoCompiler) || !strings.Contains(err.Error(), "apt-get install gcc") {
		t.Fatalf("Build without a compiler: %v; want an error naming apt-get install gcc", err)
	}
}

func TestEnv(t *testing.T) {
	got := clock.Env("/x/shim.so", "/y/off")
	want := []string{"LD_PRELOAD=/x/shim.so", clock.EnvVar + "=/y/off"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Env = %q, want %q", got, want)
	}
}

func TestOffsetFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offset")
	if err := os.WriteFile(path, []byte{1}, 0o644); err != nil { // short: extended
		t.Fatal(err)
	}
	o, err := clock.NewOffset(path)
	if err != nil {
		t.Fatal(err)
	}
	read := func() int64 {
		b, err := os.ReadFile(path)
		if err != nil || len(b) != 8 {
			t.Fatalf("offset file: %d bytes, %v", len(b), err)
		}
		return int64(binary.NativeEndian.Uint64(b))
	}
	if v := read(); v != 1 {
		t.Fatalf("extended short file holds %d, want 1 (kept, zero-padded)", v)
	}
	for _, d := range []time.Duration{time.Hour, -time.Hour - 1, 0, 1<<63 - 1} {
		set(t, o, d)
		if v := read(); v != int64(d) {
			t.Fatalf("after Set(%v) the file holds %d", d, v)
		}
		if g := o.Get(); g != d {
			t.Fatalf("Get = %v after Set(%v)", g, d)
		}
	}
	set(t, o, 42*time.Second)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := o.Set(time.Second); err == nil {
		t.Fatal("Set after Close succeeded")
	}
	o2, err := clock.NewOffset(path) // reopened: keeps the offset
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if g := o2.Get(); g != 42*time.Second {
		t.Fatalf("reopened offset = %v, want 42s", g)
	}
	if o2.Path() != path {
		t.Fatalf("Path = %q", o2.Path())
	}
}

// probe is the test program (testdata/probe.c) run under the shim: each
// read asks it for its clocks.
type probe struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

type reading struct {
	rt, coarse, tod, unix, mono int64 // ns, ns, µs, s, ns
	nullRC                      int64
}

func startProbe(t *testing.T, env []string) *probe {
	t.Helper()
	_, bin := build(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("probe: %v", err)
		}
	})
	return &probe{t: t, in: in, out: bufio.NewScanner(out)}
}

func (p *probe) read() reading {
	p.t.Helper()
	if _, err := io.WriteString(p.in, "x\n"); err != nil {
		p.t.Fatal(err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("probe: no reply: %v", p.out.Err())
	}
	f := strings.Fields(p.out.Text())
	if len(f) != 6 {
		p.t.Fatalf("probe: %q", p.out.Text())
	}
	var v [6]int64
	for i := range f {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			p.t.Fatalf("probe: %q: %v", p.out.Text(), err)
		}
		v[i] = n
	}
	return reading{v[0], v[1], v[2], v[3], v[4], v[5]}
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// checkProbe reads the probe's clocks and checks them against ours shifted
// by off: every wall clock shifted, CLOCK_MONOTONIC not.
func checkProbe(t *testing.T, p *probe, off time.Duration) {
	t.Helper()
	before, mb := time.Now().UnixNano(), monoNow()
	r := p.read()
	after, ma := time.Now().UnixNano(), monoNow()
	lo, hi := before+int64(off), after+int64(off)
	const coarse = int64(20 * time.Millisecond) // a few ticks of the coarse clock
	within := func(name string, v, lo, hi int64) {
		t.Helper()
		if v < lo || v > hi {
			t.Errorf("offset %v: %s = %d, want in [%d, %d] (off by %v)", off, name, v, lo, hi,
				time.Duration(v-(lo+hi)/2))
		}
	}
	within("CLOCK_REALTIME", r.rt, lo, hi)
	within("CLOCK_REALTIME_COARSE", r.coarse, lo-coarse, hi)
	within("gettimeofday", r.tod, lo/1000-1, hi/1000+1)
	within("time", r.unix, (lo-coarse)/1e9-1, hi/1e9)
	within("CLOCK_MONOTONIC", r.mono, mb, ma)
	if r.nullRC != 0 {
		t.Errorf("gettimeofday(NULL, NULL) = %d", r.nullRC)
	}
}

// TestShimClocks runs the probe under the shim: each Set is seen by its
// next clock read, forward and back, to the nanosecond, with monotonic time
// left alone.
func TestShimClocks(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	p := startProbe(t, clock.Env(so, o.Path()))
	for _, off := range []time.Duration{0, time.Hour, -time.Hour - 1, 1500 * time.Millisecond,
		-999 * time.Microsecond, -time.Nanosecond, 30 * 24 * time.Hour, 0} {
		set(t, o, off)
		checkProbe(t, p, off)
	}
}

// TestShimStartsShifted: a process started after a Set begins shifted.
func TestShimStartsShifted(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	set(t, o, -2*time.Hour)
	checkProbe(t, startProbe(t, clock.Env(so, o.Path())), -2*time.Hour)
}

// TestShimWithoutOffsetFile: the shim loaded but its file missing (or the
// variable unset) leaves the clocks alone.
func TestShimWithoutOffsetFile(t *testing.T) {
	so, _ := build(t)
	checkProbe(t, startProbe(t, clock.Env(so, filepath.Join(t.TempDir(), "missing"))), 0)
	checkProbe(t, startProbe(t, []string{"LD_PRELOAD=" + so}), 0)
}

// redisServer is a redis-server started by the test with env added to its
// environment; it is killed at cleanup.
type redisServer struct {
	addr string
	log  string
	c    *redis.Client
}

func startRedis(t *testing.T, env []string) *redisServer {
	t.Helper()
	bin := testserver.Binary(t, "redis-server")
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := testserver.FreePort(t)
		s := &redisServer{addr: "127.0.0.1:" + strconv.Itoa(port), log: filepath.Join(dir, "redis.log")}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no",
			"--dir", dir, "--logfile", s.log)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = os.Stderr // the shim's complaints, if any
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		stop := func() {
			_ = cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				t.Errorf("redis-server pid %d did not exit after SIGKILL", cmd.Process.Pid)
			}
		}
		s.c = redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
		if lastErr = s.waitUp(exited); lastErr == nil {
			t.Cleanup(func() { s.c.Close(); stop() })
			return s
		}
		s.c.Close()
		stop()
	}
	t.Fatalf("redis-server did not start: %v", lastErr)
	return nil
}

// waitUp waits until the server answers PING (a shim that hangs the
// server at start-up fails here).
func (s *redisServer) waitUp(exited <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(s.log)
			return fmt.Errorf("exited: %v\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PING reply in 20s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkTime checks the server's TIME against ours shifted by off.
func (s *redisServer) checkTime(t *testing.T, off time.Duration) {
	t.Helper()
	before := time.Now()
	got, err := s.c.Time(ctxT(t)).Result()
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := before.Add(off).Add(-time.Microsecond), after.Add(off).Add(time.Microsecond)
	if got.Before(lo) || got.After(hi) {
		t.Fatalf("offset %v: TIME = %v, want in [%v, %v] (off by %v)", off, got, lo, hi,
			got.Sub(before.Add(off)))
	}
}

// TestRedisTime: TIME follows the offset from the next command on.
func TestRedisTime(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	s := startRedis(t, clock.Env(so, o.Path()))
	s.checkTime(t, 0)
	set(t, o, time.Hour)
	s.checkTime(t, time.Hour)
	set(t, o, -time.Hour)
	s.checkTime(t, -time.Hour)
	set(t, o, 0)
	s.checkTime(t, 0)
}

func (s *redisServer) pttl(t *testing.T, key string) time.Duration {
	t.Helper()
	d, err := s.c.PTTL(ctxT(t), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRedisExpiryForward: a forward jump expires keys by the jumped clock,
// both on access (lazy expiry) and untouched (the active expire cycle).
func TestRedisExpiryForward(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	s := startRedis(t, clock.Env(so, o.Path()))
	ctx := ctxT(t)
	for _, k := range []string{"lazy", "active"} {
		if err := s.c.Set(ctx, k, "v", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.c.Set(ctx, "persistent", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	set(t, o, time.Hour)
	if err := s.c.Get(ctx, "lazy").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET of a 10s key right after a +1h jump: %v; want nil (expired)", err)
	}
	// "active" is never touched: the server's own expire cycle (hz 10)
	// reclaims it; DBSIZE counts expired keys not yet reclaimed.
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, err := s.c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DBSIZE = %d 3s after the jump; want 1 (only the key without TTL)", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, err := s.c.Get(ctx, "persistent").Result(); err != nil || v != "v" {
		t.Fatalf("key without TTL: %q, %v", v, err)
	}
}

// TestRedisExpiryBackward documents a backward jump: expiry times are
// absolute wall-clock instants, so a key lives longer by the jump (a 10s
// key on a clock set 1h back has 1h10s to live) and gets its 10s back when
// the clock returns.
func TestRedisExpiryBackward(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	s := startRedis(t, clock.Env(so, o.Path()))
	if err := s.c.Set(ctxT(t), "k", "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	set(t, o, -time.Hour)
	if d := s.pttl(t, "k"); d < time.Hour+9*time.Second || d > time.Hour+10*time.Second {
		t.Fatalf("PTTL after a -1h jump = %v; want about 1h10s", d)
	}
	set(t, o, 0)
	if d := s.pttl(t, "k"); d < 9*time.Second || d > 10*time.Second {
		t.Fatalf("PTTL after the clock came back = %v; want about 10s", d)
	}
}

// TestRedisResponsiveThroughJumps flips the offset every millisecond
// (forward, back, far, near) while a client keeps issuing commands: every
// command must be answered within its 2s timeout.
func TestRedisResponsiveThroughJumps(t *testing.T) {
	so, _ := build(t)
	o := newOffset(t)
	s := startRedis(t, clock.Env(so, o.Path()))
	offsets := []time.Duration{time.Hour, -time.Hour, 0, 24 * time.Hour, -10 * time.Second, 5 * time.Millisecond}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			if err := o.Set(offsets[i%len(offsets)]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	ctx := context.Background()
	end := time.Now().Add(2 * time.Second)
	ops := 0
	var err error
	for time.Now().Before(end) && err == nil {
		key := "k" + strconv.Itoa(ops%16)
		switch ops % 4 {
		case 0:
			err = s.c.Set(ctx, key, ops, 50*time.Millisecond).Err()
		case 1:
			err = s.c.Get(ctx, key).Err()
			if errors.Is(err, redis.Nil) {
				err = nil
			}
		case 2:
			err = s.c.Time(ctx).Err()
		case 3:
			err = s.c.Ping(ctx).Err()
		}
		ops++
	}
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatalf("after %d commands through clock jumps: %v", ops, err)
	}
	if ops < 100 {
		t.Fatalf("only %d commands in 2s through clock jumps", ops)
	}
	set(t, o, 0)
	s.checkTime(t, 0)
	t.Logf("%d commands answered through %v of 1ms clock jumps", ops, 2*time.Second)
}

// TestRedisWithoutShim: a server started without the shim ignores the
// offset file.
func TestRedisWithoutShim(t *testing.T) {
	o := newOffset(t)
	s := startRedis(t, nil)
	set(t, o, time.Hour)
	s.checkTime(t, 0)
	if err := s.c.Set(ctxT(t), "k", "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if d := s.pttl(t, "k"); d < 9*time.Second || d > 10*time.Second {
		t.Fatalf("PTTL = %v; want about 10s", d)
	}
}
