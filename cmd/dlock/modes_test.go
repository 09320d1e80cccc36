package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
)

// --shared, --limit and their combinations: bad values are usage errors
// (exit 2) with a message naming the flag, never a panic, and nothing is
// run.
func TestModeUsageErrors(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "0"}, `invalid value "0" for --limit`},
		{[]string{"--limit", "-1"}, `invalid value "-1" for --limit`},
		{[]string{"--limit=-5"}, `invalid value "-5" for --limit`},
		{[]string{"--limit", "99999999999999999999999"}, "want a number of permits in 1-1048576"},
		{[]string{"--limit", strconv.Itoa(dlock.MaxLimit + 1)}, "want a number of permits in 1-1048576"},
		{[]string{"--limit", "abc"}, `invalid value "abc" for --limit`},
		{[]string{"--limit", "2.5"}, `invalid value "2.5" for --limit`},
		{[]string{"--limit", ""}, `invalid value "" for --limit`},
		{[]string{"--limit", "0x10"}, `invalid value "0x10" for --limit`},
		{[]string{"--shared", "--limit", "2"}, "--shared and --limit 2 cannot be combined"},
		{[]string{"--limit", "3", "-s"}, "--shared and --limit 3 cannot be combined"},
		{[]string{"--shared=maybe"}, "invalid boolean value"},
	}
	for _, c := range cases {
		args := append(append([]string{"run"}, c.args...), "k", "--", "echo", "ran")
		r := runDlock(t, url, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("dlock %q: exit %d, stdout %q, stderr %q; want exit %d and %q", args, r.code, r.stdout, r.stderr, exitUsage, c.want)
		}
		if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("dlock %q panicked: %s", args, r.stderr)
		}
	}
	// Help documents the flags, the modes and DLOCK_MODE.
	r := runDlock(t, url, "run", "--help")
	for _, want := range []string{"-s|--shared | --limit N", "-s, --shared", "--limit N", "Modes:", "DLOCK_MODE", "writer", "semaphore"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("run --help lacks %q: %d %q", want, r.code, r.stdout)
		}
	}
	if r := runDlock(t, url, "help"); !strings.Contains(r.stdout, "--shared") || !strings.Contains(r.stdout, "--limit N") {
		t.Errorf("help lacks --shared and --limit: %q", r.stdout)
	}
	if r := runDlock(t, url, "ls", "--help"); !strings.Contains(r.stdout, "limited") || !strings.Contains(r.stdout, "holders") {
		t.Errorf("ls --help does not describe modes: %q", r.stdout)
	}
}

// noModes is a backend that offers exclusive locks only: every attempt is
// granted (no other holder exists).
type noModes struct{ token uint64 }

func (d *noModes) Spec() driver.Spec { return driver.Spec{Name: "exclusive-only"} }

func (d *noModes) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	d.token++
	return driver.Grant{Lease: nopLease{}, Token: d.token}, nil
}

type nopLease struct{}

func (nopLease) Refresh(context.Context, time.Duration) error { return nil }
func (nopLease) Release(context.Context) error                { return nil }

// tryRun is acquireForRun with -n on b: the lock (released at the end of
// the test) or nil, the exit status and what it printed.
func tryRun(t *testing.T, b *backend, r acquireRequest) (*dlock.Lock, int, string) {
	t.Helper()
	r.nonblock, r.conflict, r.attempt = true, exitConflict, hang
	if r.ttl == 0 {
		r.ttl = 10 * time.Second
	}
	var errb bytes.Buffer
	lk, code := acquireForRun(b, r, make(chan os.Signal), &errb)
	if lk != nil {
		t.Cleanup(func() { lk.Release(context.Background()) })
	}
	return lk, code, errb.String()
}

// A backend without the mode fails with its own error naming the mode:
// exit 2 (asking again will not help), the message on stderr, and an
// exclusive lock is never taken instead.
func TestModeUnsupportedByBackend(t *testing.T) {
	t.Parallel()
	d := &noModes{}
	b := &backend{locker: dlock.NewEngine(d), close: func() {}, where: "test://exclusive-only"}
	for _, c := range []struct {
		r    acquireRequest
		want string
	}{
		{acquireRequest{key: "k", mode: dlock.Shared}, "does not offer shared locks"},
		{acquireRequest{key: "k", mode: dlock.Limited, limit: 3}, "does not offer limited locks"},
	} {
		lk, code, msg := tryRun(t, b, c.r)
		if lk != nil || code != exitUsage || !strings.Contains(msg, c.want) || !strings.Contains(msg, "exclusive-only") || !strings.Contains(msg, "test://exclusive-only") {
			t.Errorf("%v on a backend without it: lock %v, exit %d, stderr %q; want exit %d and %q", c.r.mode, lk != nil, code, msg, exitUsage, c.want)
		}
	}
	if d.token != 0 {
		t.Errorf("the backend was asked %d times for a lock of a mode it does not offer", d.token)
	}
	if lk, code, msg := tryRun(t, b, acquireRequest{key: "k", mode: dlock.Exclusive}); lk == nil || code != 0 {
		t.Errorf("exclusive on the same backend: exit %d %q", code, msg)
	}
}

// On a backend with the modes (memlock, in process), run's conflict
// messages say how the key is held, and a --limit other than the holders'
// is a usage error naming both limits.
func TestModeConflictMessages(t *testing.T) {
	t.Parallel()
	b := &backend{locker: memlock.New(), close: func() {}, where: "mem://"}
	r1, code, msg := tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Shared})
	if r1 == nil {
		t.Fatalf("first reader: exit %d %q", code, msg)
	}
	r2, code, msg := tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Shared})
	if r2 == nil || r2.Token() <= r1.Token() {
		t.Fatalf("second reader: exit %d %q", code, msg)
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Exclusive})
	if code != exitConflict || !strings.Contains(msg, `lock "rw" is held shared by owner `) || !strings.Contains(msg, "and 1 other holder(s)") || !strings.Contains(msg, "lease ends in") {
		t.Errorf("writer against two readers: exit %d %q", code, msg)
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Limited, limit: 2})
	if code != exitConflict || !strings.Contains(msg, `lock "rw" is held shared`) {
		t.Errorf("a permit against two readers: exit %d %q", code, msg)
	}
	// A writer waits (a blocking Acquire): a new reader is refused, and
	// told why.
	wctx, stopWriter := context.WithCancel(context.Background())
	writerDone := make(chan error, 1)
	go func() {
		lk, err := b.locker.Acquire(wctx, "rw")
		if lk != nil {
			lk.Release(context.Background())
		}
		writerDone <- err
	}()
	waitFor(t, hang, "the waiting writer to keep a new reader out", func() bool {
		lk, code, _ := tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Shared})
		if lk != nil {
			lk.Release(context.Background())
		}
		return code == exitConflict
	})
	_, code, msg = tryRun(t, b, acquireRequest{key: "rw", mode: dlock.Shared})
	if code != exitConflict || !strings.Contains(msg, `lock "rw" is held shared by owner `) || !strings.Contains(msg, "an exclusive run is waiting for it") {
		t.Errorf("reader behind a waiting writer: exit %d %q", code, msg)
	}
	stopWriter()
	if err := <-writerDone; err == nil {
		t.Errorf("the writer got the key while two readers held it")
	}

	for i := 0; i < 2; i++ {
		if lk, code, msg := tryRun(t, b, acquireRequest{key: "sem", mode: dlock.Limited, limit: 2}); lk == nil {
			t.Fatalf("permit %d of 2: exit %d %q", i+1, code, msg)
		}
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "sem", mode: dlock.Limited, limit: 2})
	if code != exitConflict || !strings.Contains(msg, `all 2 permits of lock "sem" are held by owner `) || !strings.Contains(msg, "and 1 other holder(s)") {
		t.Errorf("third permit of 2: exit %d %q", code, msg)
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "sem", mode: dlock.Shared})
	if code != exitConflict || !strings.Contains(msg, `lock "sem" is held as a semaphore by owner `) {
		t.Errorf("a reader against permits: exit %d %q", code, msg)
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "sem", mode: dlock.Limited, limit: 5})
	if code != exitUsage || !strings.Contains(msg, "2") || !strings.Contains(msg, "5") || !strings.Contains(msg, "mismatch") {
		t.Errorf("--limit 5 on a key held with --limit 2: exit %d %q; want exit %d naming both limits", code, msg, exitUsage)
	}

	if lk, code, msg := tryRun(t, b, acquireRequest{key: "x", mode: dlock.Exclusive}); lk == nil {
		t.Fatalf("exclusive: exit %d %q", code, msg)
	}
	_, code, msg = tryRun(t, b, acquireRequest{key: "x", mode: dlock.Shared})
	if code != exitConflict || !strings.Contains(msg, `lock "x" is held by owner `) || strings.Contains(msg, "waiting") {
		t.Errorf("a reader against a writer: exit %d %q", code, msg)
	}
}

// ls shows each key's mode, limit and every holder, in the table and in
// JSON (the existing fields kept, limit and holders added).
func TestLsShowsModes(t *testing.T) {
	t.Parallel()
	ml := memlock.New()
	b := &backend{locker: ml, close: func() {}, where: "mem://"}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	take := func(key string, opts ...dlock.Option) *dlock.Lock {
		t.Helper()
		lk, err := ml.TryAcquire(ctx, key, append(opts, dlock.WithTTL(time.Minute), dlock.WithMetadata("job", key))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lk.Release(context.Background()) })
		return lk
	}
	ex := take("a/excl")
	r1, r2 := take("a/read", dlock.WithShared()), take("a/read", dlock.WithShared())
	p1, p2 := take("a/sem", dlock.WithLimit(3)), take("a/sem", dlock.WithLimit(3))
	infos, err := b.list(ctx, "a/")
	if err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if code := printLocks(&out, infos, b.where, false); code != 0 {
		t.Fatalf("table: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 6 || strings.Join(strings.Fields(lines[0]), " ") != lsHeader {
		t.Fatalf("table: %q", out.String())
	}
	pid := strconv.Itoa(os.Getpid())
	want := []struct {
		key, mode, limit string
		lk               *dlock.Lock
	}{
		{"a/excl", "exclusive", "-", ex},
		{"a/read", "shared", "-", r1}, {"a/read", "shared", "-", r2},
		{"a/sem", "limited", "3", p1}, {"a/sem", "limited", "3", p2},
	}
	for i, w := range want {
		f := strings.Fields(lines[i+1])
		if len(f) != 9 || f[0] != w.key || f[1] != w.mode || f[7] != w.limit || !strings.HasPrefix(f[2], w.lk.Owner()[:12]+"/") || holderPID(f[2]) != pid ||
			f[3] != strconv.FormatUint(w.lk.Token(), 10) || f[5] == "-" || f[8] != "job="+w.key {
			t.Errorf("table row %d: %q, want key %s mode %s limit %s owner %s token %d", i+1, lines[i+1], w.key, w.mode, w.limit, w.lk.Owner()[:12], w.lk.Token())
		}
	}

	out.Reset()
	if code := printLocks(&out, infos, b.where, true); code != 0 {
		t.Fatalf("json: exit %d", code)
	}
	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 5 {
		t.Fatalf("json: %v %q", err, out.String())
	}
	for i, w := range want {
		row := rows[i]
		for _, field := range []string{"key", "mode", "owner", "token", "ttl_ms", "waiters", "metadata", "holders"} {
			if _, ok := row[field]; !ok {
				t.Errorf("json row %d lacks %q: %v", i, field, row)
			}
		}
		holders := 1
		if w.key != "a/excl" {
			holders = 2
		}
		_, hasLimit := row["limit"]
		if row["key"] != w.key || row["mode"] != w.mode || row["owner"] != w.lk.Owner() || row["token"] != float64(w.lk.Token()) ||
			row["holders"] != float64(holders) || hasLimit != (w.mode == "limited") || hasLimit && row["limit"] != float64(3) ||
			row["ttl_ms"].(float64) <= 0 || row["metadata"].(map[string]any)["job"] != w.key {
			t.Errorf("json row %d: %v, want key %s mode %s owner %s token %d holders %d", i, row, w.key, w.mode, w.lk.Owner(), w.lk.Token(), holders)
		}
	}
}

// Metadata other than host and pid goes to the last column, sorted, and
// quoted like any field when it holds spaces or control characters.
func TestOtherMetadata(t *testing.T) {
	t.Parallel()
	cases := []struct {
		md   map[string]string
		want string
	}{
		{nil, "-"},
		{map[string]string{"host": "h", "pid": "1"}, "-"},
		{map[string]string{"host": "h", "b": "2", "a": "1"}, "a=1,b=2"},
		{map[string]string{"cmd": "dlock run"}, `"cmd=dlock run"`},
		{map[string]string{"x": "\x1b[2J\n"}, `"x=\x1b[2J\n"`},
	}
	for _, c := range cases {
		if got := dash(quoteField(otherMetadata(c.md))); got != c.want {
			t.Errorf("%v: %s, want %s", c.md, got, c.want)
		}
	}
}

// The child learns its lock's mode: DLOCK_MODE, and DLOCK_LIMIT for a
// permit (an outer run's DLOCK_LIMIT is not passed on to an exclusive
// one).
func TestRunModeEnvironment(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	r := runDlock(t, url, "run", "k", "--", "sh", "-c", `echo "$DLOCK_MODE:${DLOCK_LIMIT-unset}"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "exclusive:unset" {
		t.Fatalf("exclusive run: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	cmd := dlockCmd(ctx, url, "run", "k2", "--", "sh", "-c", `echo "$DLOCK_MODE:${DLOCK_LIMIT-unset}"`)
	cmd.Env = append(cmd.Env, "DLOCK_LIMIT=7", "DLOCK_MODE=limited")
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "exclusive:unset" {
		t.Fatalf("exclusive run inside a limited one: %v %q", err, out)
	}
	requireModes(t, url)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--shared"}, "shared:unset"},
		{[]string{"--limit", "4"}, "limited:4"},
	} {
		args := append(append([]string{"run"}, c.args...), "m", "--", "sh", "-c", `echo "$DLOCK_MODE:${DLOCK_LIMIT-unset}"`)
		if r := runDlock(t, url, args...); r.code != 0 || strings.TrimSpace(r.stdout) != c.want {
			t.Errorf("dlock %q: exit %d, stdout %q, stderr %q; want %q", args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// onModeBackends runs test on each backend, at once: a directory of its
// own for file://, servers shared by the tests of modes otherwise (each
// test uses keys of its own; none pauses or stops a server).
func onModeBackends(t *testing.T, test func(t *testing.T, url string)) {
	backends := []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"file", fileURL},
		{"redis", func(t *testing.T) string {
			return "redis://" + testserver.Shared(t, "modes-redis", func(tb testserver.TB) *testserver.Redis { return testserver.StartRedis(tb) }).Addr()
		}},
		{"etcd", func(t *testing.T) string { return testserver.Shared(t, "modes-etcd", startServe).url }},
		// A short session: a killed holder's lease is its session.
		{"zk", func(t *testing.T) string {
			return "zk://" + sharedZooKeeper(t).Addr() + "/cli/modes?session_timeout=4s"
		}},
		{"postgres", func(t *testing.T) string {
			return testserver.Shared(t, "modes-postgres", func(tb testserver.TB) *testserver.Postgres { return testserver.StartPostgres(tb) }).DSN("")
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url := b.url(t)
			requireModes(t, url)
			test(t, url)
		})
	}
}

// requireModes checks that url's backend offers shared and limited locks
// (every backend but redlock does), on a key of the test's own.
func requireModes(t *testing.T, url string) {
	t.Helper()
	for _, flag := range [][]string{{"--shared"}, {"--limit", "1"}} {
		args := append(append([]string{"run", "-n"}, flag...), "dlock-mode-probe/"+t.Name(), "--", "true")
		r := runDlock(t, url, args...)
		if r.code != 0 {
			t.Fatalf("dlock %q: exit %d %q", args, r.code, r.stderr)
		}
	}
}

// marker creates dir/name.
func marker(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitFile waits (bounded by hang) until dir/name exists.
func waitFile(t *testing.T, dir, name string) {
	t.Helper()
	waitFor(t, hang, name, func() bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	})
}

// shWaitFor is a shell loop waiting, for at most 60s, until file $1 exists;
// it exits 9 if it never does.
const shWaitFor = `i=0; until [ -e "$1" ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 9; sleep 0.01; done`

// Two --shared runs hold the key together, and an exclusive run waits for
// both: each reader waits until the other has started (so they finish
// only if they overlapped), and the writer's command checks that both
// readers had finished before it started. While the writer waits, new
// --shared runs wait behind it (writer preference): -n ones are refused,
// and a blocking one starts only after the writer has finished.
func TestSharedRunsOverlapWriterWaits(t *testing.T) {
	t.Parallel()
	onModeBackends(t, testSharedRunsOverlap)
}

func testSharedRunsOverlap(t *testing.T, url string) {
	dir := t.TempDir()
	reader := func(me, other string) []string {
		script := fmt.Sprintf(`cd %q || exit 8; : > %s.started; echo started; set -- %s.started; %s; set -- go; %s; : > %s.done`,
			dir, me, other, shWaitFor, shWaitFor, me)
		return []string{"run", "--shared", "catalog", "--", "sh", "-c", script}
	}
	ra, _, _ := background(t, url, reader("a", "b")...)
	rb, _, _ := background(t, url, reader("b", "a")...)
	waitFile(t, dir, "a.started")
	waitFile(t, dir, "b.started")

	// The key is held shared by both: a writer cannot have it now.
	r := runDlock(t, url, "run", "-n", "catalog", "--", "true")
	if r.code != exitConflict || !strings.Contains(r.stderr, "held shared") || !strings.Contains(r.stderr, "1 other holder") {
		t.Fatalf("-n writer while two readers hold: exit %d %q", r.code, r.stderr)
	}
	r = runDlock(t, url, "ls", "--json", "catalog")
	var rows []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 2 || rows[0].Mode != "shared" || rows[1].Mode != "shared" ||
		rows[0].Holders != 2 || rows[0].Owner == rows[1].Owner || rows[0].Token == rows[1].Token ||
		!strings.HasPrefix(url, "zk://") && (rows[0].TTLms <= 0 || rows[1].TTLms <= 0) || // ZooKeeper's lease is the holder's session
		rows[0].Metadata["pid"] == rows[1].Metadata["pid"] {
		t.Errorf("ls --json with two readers: %v %q %q", err, r.stdout, r.stderr)
	}

	start := func(args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		cmd := dlockCmd(ctx, url, args...)
		out, errb := &syncBuffer{}, &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); stopCmd(t, cmd) })
		return cmd, out, errb
	}
	writer, wout, werr := start("run", "catalog", "--", "sh", "-c",
		fmt.Sprintf(`cd %q && if [ -e a.done ] && [ -e b.done ]; then echo after-both; else echo EARLY; fi; : > w.done`, dir))
	// Once the writer waits, a new reader is refused at once...
	waitFor(t, hang, "the waiting writer to keep new readers out", func() bool {
		r = runDlock(t, url, "run", "-n", "--shared", "catalog", "--", "true")
		return r.code == exitConflict
	})
	if !strings.Contains(r.stderr, "an exclusive run is waiting") {
		t.Errorf("-n reader behind a waiting writer: %q", r.stderr)
	}
	// ... and a blocking one runs after the writer.
	late, lout, lerr := start("run", "--shared", "catalog", "--", "sh", "-c",
		fmt.Sprintf(`cd %q && if [ -e w.done ]; then echo after-writer; else echo BEFORE-WRITER; fi`, dir))
	marker(t, dir, "go")
	for i, rd := range []*exec.Cmd{ra, rb} {
		if code := waitExit(t, rd); code != 0 {
			t.Fatalf("reader %d: exit %d", i+1, code)
		}
	}
	if code := waitExit(t, writer); code != 0 || strings.TrimSpace(wout.String()) != "after-both" {
		t.Fatalf("writer: exit %d, stdout %q, stderr %q; want it to start after both readers", code, wout.String(), werr.String())
	}
	if code := waitExit(t, late); code != 0 || strings.TrimSpace(lout.String()) != "after-writer" {
		t.Fatalf("late reader: exit %d, stdout %q, stderr %q; want it to start after the waiting writer", code, lout.String(), lerr.String())
	}
}

// --limit 2 lets two of three runs hold the key at once, never three: each
// run records how many runs are inside when it enters, and the first two
// stay inside until both are in.
func TestLimitTwoOfThree(t *testing.T) {
	t.Parallel()
	onModeBackends(t, testLimitTwoOfThree)
}

func testLimitTwoOfThree(t *testing.T, url string) {
	dir := t.TempDir()
	// Enter: a file of our own, then count them (and log the count); wait
	// for "go"; leave.
	script := fmt.Sprintf(`cd %q || exit 8; : > in.$$; n=$(ls in.* | wc -l); echo $n >> counts; echo started; set -- go; %s; rm in.$$`, dir, shWaitFor)
	args := []string{"run", "--limit", "2", "encoders", "--", "sh", "-c", script}
	first, _, _ := background(t, url, args...)
	second, _, _ := background(t, url, args...)

	// Both permits are taken: a third -n run is refused, and ls shows them.
	r := runDlock(t, url, "run", "-n", "--limit", "2", "encoders", "--", "true")
	if r.code != exitConflict || !strings.Contains(r.stderr, `all 2 permits of lock "encoders" are held`) {
		t.Fatalf("-n third permit: exit %d %q", r.code, r.stderr)
	}
	r = runDlock(t, url, "ls", "encoders")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Errorf("ls with two permits held: %d %q %q", r.code, r.stdout, r.stderr)
	}
	pids := map[string]bool{strconv.Itoa(first.Process.Pid): true, strconv.Itoa(second.Process.Pid): true}
	for _, l := range lines[1:] {
		// KEY MODE HOLDER TOKEN HELD-FOR TTL-LEFT WAITERS LIMIT METADATA
		if f := strings.Fields(l); len(f) < 9 || f[0] != "encoders" || f[1] != "limited" || f[7] != "2" || !pids[holderPID(f[2])] {
			t.Errorf("ls row %q: want encoders, limited, 2 and a holder's pid %v", l, pids)
		} else {
			delete(pids, holderPID(f[2]))
		}
	}
	// Another limit than the holders' is a usage error naming both.
	r = runDlock(t, url, "run", "-n", "--limit", "3", "encoders", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "2") || !strings.Contains(r.stderr, "3") {
		t.Errorf("--limit 3 on a key held with --limit 2: exit %d %q", r.code, r.stderr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	third := dlockCmd(ctx, url, args...)
	var tout, terr syncBuffer
	third.Stdout, third.Stderr = &tout, &terr
	if err := third.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, third) })
	marker(t, dir, "go")
	for i, c := range []*exec.Cmd{first, second, third} {
		if code := waitExit(t, c); code != 0 {
			t.Fatalf("run %d: exit %d (third's stderr %q)", i+1, code, terr.String())
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "counts"))
	if err != nil {
		t.Fatal(err)
	}
	counts := strings.Fields(string(b))
	if len(counts) != 3 {
		t.Fatalf("counts %q: want one per run", counts)
	}
	two := false
	for _, c := range counts {
		switch c {
		case "1":
		case "2":
			two = true
		default:
			t.Errorf("%s runs held --limit 2 at once (counts %q)", c, counts)
		}
	}
	if !two {
		t.Errorf("two runs never held the key together (counts %q)", counts)
	}
}

// A SIGKILLed --shared run's lease ends on its own, at its expiry, while
// the other reader's is renewed: ls soon lists the survivor alone, and a
// writer still cannot have the key.
func TestKilledReaderExpiresAlone(t *testing.T) {
	t.Parallel()
	onModeBackends(t, testKilledReaderExpiresAlone)
}

func testKilledReaderExpiresAlone(t *testing.T, url string) {
	const hold = "echo started; exec sleep 60"
	doomed, _, _ := background(t, url, "run", "--shared", "--ttl", "2s", "shelf", "--", "sh", "-c", hold)
	survivor, _, _ := background(t, url, "run", "--shared", "--ttl", "2s", "shelf", "--", "sh", "-c", hold)
	if err := doomed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitExit(t, doomed)
	pid := strconv.Itoa(survivor.Process.Pid)
	var rows []lockInfo
	waitFor(t, hang, "the killed reader's lease to expire", func() bool {
		r := runDlock(t, url, "ls", "--json", "shelf")
		rows = nil
		return json.Unmarshal([]byte(r.stdout), &rows) == nil && len(rows) == 1
	})
	if rows[0].Metadata["pid"] != pid || rows[0].Mode != "shared" || rows[0].Holders != 1 {
		t.Fatalf("after the kill, ls lists %+v; want the surviving reader (pid %s) alone", rows[0], pid)
	}
	if r := runDlock(t, url, "run", "-n", "shelf", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "pid="+pid) {
		t.Fatalf("-n writer while the survivor holds: exit %d %q", r.code, r.stderr)
	}
	survivor.Process.Signal(syscall.SIGTERM)
	waitExit(t, survivor)
	if r := runDlock(t, url, "run", "-n", "shelf", "--", "true"); r.code != 0 {
		t.Fatalf("-n writer after both readers: exit %d %q", r.code, r.stderr)
	}
}
