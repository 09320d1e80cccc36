package redisproto_test

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// scriptFiles returns the names (without ".lua") of the embedded scripts,
// helpers.lua aside, and their sources.
func scriptFiles(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := fs.WalkDir(redisproto.LuaFiles, "lua", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !strings.HasSuffix(path, ".lua") || strings.HasSuffix(path, "/"+redisproto.HelpersFile) {
			return nil
		}
		b, err := redisproto.LuaFiles.ReadFile(path)
		out[strings.TrimSuffix(strings.TrimPrefix(path, "lua/"), ".lua")] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no embedded scripts")
	}
	return out
}

// The helpers go on the script's first line: a linked script has the
// lines of its file, every line after the first unchanged, so the line
// numbers Redis reports are the file's.
func TestLinkedScriptsKeepTheirLines(t *testing.T) {
	t.Parallel()
	for name, src := range scriptFiles(t) {
		linked, err := redisproto.Link(src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, got := strings.Split(src, "\n"), strings.Split(linked, "\n")
		if len(got) != len(want) || !slices.Equal(got[1:], want[1:]) || !strings.HasSuffix(got[0], want[0]) {
			t.Errorf("%s: the linked script's lines differ from the file's after line 1", name)
		}
		if !strings.HasPrefix(want[0], "-- "+name+".lua: ") {
			t.Errorf("%s: the file does not start with its header comment: %q", name, want[0])
		}
		for _, part := range []string{"KEYS[1]", "ARGV[1]", "Returns"} {
			if !strings.Contains(src, "\n-- "+part) {
				t.Errorf("%s: the header documents no %s", name, part)
			}
		}
	}
}

func TestLink(t *testing.T) {
	t.Parallel()
	helpers := `-- the file's comment
local function a()
  return 1 -- a comment
end

-- b's comment, calling c()
local function b()
  return a() .. '--not a comment' .. "it's"
end
local function c() return 3 end
`
	src := "-- header; calls c() only in this comment\nreturn b()\n"
	got, err := redisproto.LinkWith(src, helpers)
	want := `local function a() return 1 end local function b() return a() .. '--not a comment' .. "it's" end ` + src
	if err != nil || got != want {
		t.Fatalf("LinkWith = %q, %v\nwant %q", got, err, want)
	}
	// Names used as fields are not calls of helpers.
	if got, err := redisproto.LinkWith("return x.a(), y:c()", helpers); err != nil || got != "return x.a(), y:c()" {
		t.Fatalf("LinkWith(fields) = %q, %v", got, err)
	}
	// The package's constants come with the helpers that use them.
	got, err = redisproto.Link("return RECEIPTS")
	if err != nil || got != fmt.Sprintf("local RECEIPTS = %d return RECEIPTS", redisproto.Receipts) {
		t.Fatalf("Link(RECEIPTS) = %q, %v", got, err)
	}

	for _, tc := range []struct{ name, helpers, src, err string }{
		{"helper defined below", "local function a() return b() end\nlocal function b() end\n", "return 1", "defined below"},
		{"ambiguous call", "local function a()\n  local f = g\n  (f)()\nend\n", "return 1", "starts with '('"},
		{"code outside a helper", "x = 1\nlocal function a() end\n", "return 1", "outside a helper"},
		{"long comment", "", "--[[ x ]]\nreturn 1", "long comments"},
		{"long string", "", "return [==[x]==]", "long strings"},
		{"unfinished string", "", "return 'a\n'", "unfinished string"},
		{"shebang", "", "#!lua\nreturn 1", "shebang"},
	} {
		if _, err := redisproto.LinkWith(tc.src, tc.helpers); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: err = %v, want one mentioning %q", tc.name, err, tc.err)
		}
	}
}

// scriptCall is one EVALSHA of a script: its keys and arguments and the
// first integer of the reply it must give.
type scriptCall struct {
	keys []string
	args []any
	want int64
}

// Every embedded script is loaded by the package, SCRIPT LOAD accepts it,
// and EVALSHA runs it without error through its main branches.
func TestEveryScriptLoadsAndRuns(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	ctx := dlocktest.Context(t)
	n := redisproto.NewNode(c, "dlock")
	k := key(t)
	lk := n.LockKey(k)
	wk, rk, fk, ch := n.WaitersKey(k), n.ReceiptsKey(k), n.FenceKey(k), n.WaiterChannel(k, "")
	hk, hdk, wrk := n.HoldersKey(k), n.HoldersKey(k)+"d", n.WritersKey(k)
	gk := []string{lk, wk, rk, hk, hdk, wrk}
	const own, other = "00000000000000000000000000000001", "00000000000000000000000000000002"
	cases := map[string]struct {
		setup []string // a lock key value to SET first, and waiters to queue
		calls []scriptCall
	}{
		"acquire": {[]string{"|41"}, []scriptCall{
			{[]string{lk, wk, rk}, []any{own, 60000, "{}", "", 0}, 1},       // over a marker: token above 41 (the server time), receipt 41
			{[]string{lk, wk, rk}, []any{own, 60000, "{}", "", 0}, 1},       // retried
			{[]string{lk, wk, rk}, []any{other, 60000, "{}", "w1", 123}, 0}, // held: queued
			{gk, []any{other, 60000, "{}", "w1", 123, "wr1"}, 0},            // held: a waiting writer
		}},
		"acquire_fast": {[]string{"|41"}, []scriptCall{
			{[]string{lk, rk}, []any{own, 60000, "{}", "0"}, 1},   // over a marker: token above 41, receipt 41
			{[]string{lk, rk}, []any{own, 60000, "{}", "1"}, 2},   // retried: acquire.lua answers
			{[]string{lk, rk}, []any{other, 60000, "{}", "0"}, 2}, // held, a refusal that registers: acquire.lua answers
			{[]string{lk, rk}, []any{other, 60000, "{}", "1"}, 0}, // held: refused
		}},
		"held": {[]string{own + "|7|{}"}, []scriptCall{
			{[]string{lk, hk}, []any{own, "0"}, 1},
			{[]string{lk, hk}, []any{other, "0"}, 0},
			{[]string{lk, hk}, []any{own, "1"}, 0}, // not a group holder
		}},
		"release_fast": {[]string{own + "|7|{}"}, []scriptCall{
			{[]string{lk, wk}, []any{other + "|", 3600000}, 2}, // not this owner's
			{[]string{lk, wk}, []any{own + "|", 3600000}, 1},   // the marker |7
			{[]string{lk, wk}, []any{own + "|", 3600000}, 2},   // retried: release.lua answers
		}},
		"acquire_group": {[]string{"|41"}, []scriptCall{
			{gk, []any{own, 60000, "{}", "", 0, "s", 0, ch, 100, "0"}, 1},     // over a marker: token above 41
			{gk, []any{own, 60000, "{}", "", 0, "s", 0, ch, 100, "0"}, 1},     // retried
			{gk, []any{other, 60000, "{}", "w1", 1, "l", 2, ch, 100, "0"}, 0}, // another mode
			{gk, []any{other, 60000, "{}", "w1", 1, "s", 0, ch, 100, "0"}, 1}, // a second reader
		}},
		"refresh_group": {[]string{"*s|5|0"}, []scriptCall{
			{[]string{lk, hk, hdk}, []any{own, 60000}, 0}, // no such holder
		}},
		"release_group": {[]string{"*s|5|0"}, []scriptCall{
			{[]string{lk, wk, rk, hk, hdk}, []any{own, 3600000, ch, 100, "5", "0"}, 0},
		}},
		"leave": {nil, []scriptCall{
			{[]string{wk, wrk}, []any{"wr1", ch}, 0},
		}},
		"holders": {[]string{"*s|5|0"}, []scriptCall{
			{[]string{lk, hk, hdk}, nil, 0},
		}},
		"refresh": {[]string{own + "|1|{}"}, []scriptCall{
			{[]string{lk}, []any{own + "|", 60000}, 1},
			{[]string{lk}, []any{other + "|", 60000}, 0},
		}},
		"release": {[]string{own + "|7|{}", "w1"}, []scriptCall{
			{[]string{lk, wk, rk}, []any{own + "|", 3600000, ch, 100, "7", "0"}, 1}, // wakes nobody: w1 does not listen
			{[]string{lk, wk, rk}, []any{own + "|", 3600000, ch, 100, "7", "0"}, 1}, // retried: the marker
			{[]string{lk, wk, rk}, []any{other + "|", 3600000, ch, 100, "", "1"}, 0},
		}},
		"break": {[]string{own + "|7|{}", "w1"}, []scriptCall{ // replies {value, removed, others}
			{[]string{lk, wk, hk, hdk, lk + ":pk"}, []any{other, 3600000, ch, 100, "0"}, 0}, // another owner: kept
			{[]string{lk, wk, hk, hdk, lk + ":pk"}, []any{own, 3600000, ch, 100, "0"}, 0},   // owner: marker |9
			{[]string{lk, wk, hk, hdk, lk + ":pk"}, []any{"", 3600000, ch, 100, "1"}, 0},    // free
			{[]string{lk, wk, hk, hdk, lk + ":pk"}, []any{"", 100, ch, 100, "0", "1"}, 0},   // free, Redlock node
		}},
		"quorum_grant": {[]string{"|41"}, []scriptCall{
			{[]string{lk, fk, wk, rk}, []any{own, 60000, "{}", "", 0, "0", 60000, 1000000}, 1},
			{[]string{lk, fk, wk, rk}, []any{own, 60000, "{}", "", 0, "9007199254740000", 60000, 1000000}, 1}, // retried, another proposal
			{[]string{lk, fk, wk, rk}, []any{other, 60000, "{}", "1-a", 1, "0", 60000, 1000000}, 0},
		}},
		"quorum_commit": {[]string{own + "|0|{}"}, []scriptCall{
			{[]string{lk, fk}, []any{own + "|", "123", own + "|123|{}", 60000}, 1},
			{[]string{lk, fk}, []any{other + "|", "124", other + "|124|{}", 60000}, 0},
		}},
		"quorum_release": {[]string{own + "|123|{}", "w1"}, []scriptCall{
			{[]string{lk, wk, rk}, []any{own + "|", ch, 100, "123", 3600000, "1"}, 1}, // Cluster: reserves for w1
			{[]string{lk, wk, rk}, []any{own + "|", ch, 100, "123", 3600000, "0"}, 1}, // retried: the marker
			{[]string{lk, wk, rk}, []any{other + "|", ch, 100, "", 3600000, "0"}, 0},
		}},
	}
	files := scriptFiles(t)
	scripts := redisproto.Scripts()
	for name := range files {
		if scripts[name] == nil {
			t.Errorf("lua/%s.lua is embedded but the package never loads it", name)
		}
		if _, ok := cases[name]; !ok {
			t.Errorf("lua/%s.lua: no test case", name)
		}
	}
	for name, s := range scripts {
		if _, ok := files[name]; !ok {
			t.Errorf("script %s has no file", name)
		}
		sha, err := s.Load(ctx, c).Result() // SCRIPT LOAD
		if err != nil {
			t.Errorf("SCRIPT LOAD %s: %v", name, err)
			continue
		}
		if sha != s.Hash() {
			t.Errorf("%s: SCRIPT LOAD gave %s, the client computed %s", name, sha, s.Hash())
		}
		tc := cases[name]
		if err := c.Del(ctx, lk, wk, rk, fk, hk, hdk, wrk).Err(); err != nil {
			t.Fatal(err)
		}
		if len(tc.setup) > 0 {
			if err := c.Set(ctx, lk, tc.setup[0], 0).Err(); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.setup[1:] {
				if err := c.ZAdd(ctx, wk, redis.Z{Score: 1, Member: w}).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i, call := range tc.calls {
			res, err := c.EvalSha(ctx, sha, call.keys, call.args...).Result()
			if err != nil {
				t.Errorf("%s, call %d: EVALSHA: %v", name, i, err)
				continue
			}
			if got := firstInt(res); got != call.want {
				t.Errorf("%s, call %d: reply %v, want %d first", name, i, res, call.want)
			}
		}
	}
}

func firstInt(res any) int64 {
	if l, ok := res.([]any); ok && len(l) > 0 {
		res = l[0]
	}
	v, _ := res.(int64)
	return v
}

// errLines returns the script line numbers a Redis error names.
var errLine = regexp.MustCompile(`user_script:(\d+)`)

func errLines(err error) []int {
	var out []int
	for _, m := range errLine.FindAllStringSubmatch(err.Error(), -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// lineOf is the number of the line of src containing s.
func lineOf(t *testing.T, src, s string) int {
	t.Helper()
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no line contains %q", s)
	return 0
}

// A runtime error in a script is reported on its line in the .lua file:
// the helpers in front of the script do not shift its lines. An error
// inside a helper is reported on line 1, where the helpers are.
func TestScriptErrorLines(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	c := newClient(t, srv.Addr())
	ctx := dlocktest.Context(t)
	n := redisproto.NewNode(c, "dlock")
	k := key(t)
	lk := n.LockKey(k)
	wantLine := func(what string, err error, line int) {
		t.Helper()
		if err == nil || redis.HasErrorPrefix(err, "NOSCRIPT") {
			t.Fatalf("%s: err = %v, want a script error", what, err)
		}
		lines := errLines(err)
		if len(lines) == 0 {
			t.Fatalf("%s: %v names no line", what, err)
		}
		for _, l := range lines {
			if l != line {
				t.Fatalf("%s: %v: reported at line %d, want %d", what, err, l, line)
			}
		}
		t.Logf("%s: %v", what, err)
	}

	// Scripts of the test's own, linked like the package's, calling a
	// helper (so that one is put in front of line 1).
	for _, src := range []string{
		"-- a Lua error\nlocal t = now_ms()\n\nlocal x = nil\nreturn x.y -- line 5\n",
		"-- a redis.call error\nlocal t = now_ms()\nreturn redis.call('SET', KEYS[1], t, 'PX', 'abc') -- line 3\n",
	} {
		linked, err := redisproto.Link(src)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(linked, "local function now_ms()") {
			t.Fatalf("now_ms not linked: %q", linked)
		}
		line := lineOf(t, src, "-- line ")
		wantLine(strings.SplitN(src, "\n", 2)[0], c.Eval(ctx, linked, []string{lk}).Err(), line)
	}

	// The package's own acquire.lua, with a TTL that SET refuses.
	acquire := redisproto.Scripts()["acquire"]
	src, err := redisproto.LuaFiles.ReadFile("lua/acquire.lua")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{lk, n.WaitersKey(k), n.ReceiptsKey(k)}
	own := strings.Repeat("a", 32)
	wantLine("acquire.lua, bad TTL",
		acquire.Run(ctx, c, keys, own, "not-a-ttl", "{}", "", 0).Err(),
		lineOf(t, string(src), "redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok"))

	// A helper's error: queue_waiter's ZADD with a score that is no number.
	if err := acquire.Run(ctx, c, keys, own, 60000, "{}", "", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wantLine("acquire.lua, bad score (in queue_waiter)",
		acquire.Run(ctx, c, keys, strings.Repeat("b", 32), 60000, "{}", "w", "not-a-score").Err(), 1)
}
