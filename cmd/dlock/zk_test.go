package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
)

// zkClient connects to a test ZooKeeper directly, as another client would.
func zkClient(t *testing.T, addr string, opts ...zklock.Option) *zk.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := zklock.Connect(ctx, []string{addr}, 10*time.Second, append(opts, zklock.WithLogger(zkQuiet{}))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

// zk:// runs commands under the lock with increasing tokens, reports the
// holder of a held key, lists it, and hands the key on when it is released.
func TestZooKeeperURLAndLs(t *testing.T) {
	t.Parallel()
	srv := testserver.StartZooKeeper(t)
	url := "zk://" + srv.Addr() + "/cli/locks"
	var last uint64
	for i := 0; i < 2; i++ {
		r := runDlock(t, url, "run", "zkjob", "--", "sh", "-c", `echo "$DLOCK_TOKEN"`)
		tok, err := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64)
		if r.code != 0 || err != nil || tok <= last {
			t.Fatalf("run on zookeeper: %d %q %q", r.code, r.stdout, r.stderr)
		}
		last = tok
	}
	// A server list: the client finds the live one.
	if r := runDlock(t, "zk://"+deadAddr(t)+","+srv.Addr()+"/cli/locks", "run", "zkjob", "--", "true"); r.code != 0 {
		t.Fatalf("run with a dead server listed first: %d %q", r.code, r.stderr)
	}
	holder, _, _ := background(t, url, "run", "reports/zk", "--", "sh", "-c", "echo started; exec sleep 60")
	pid := strconv.Itoa(holder.Process.Pid)
	r := runDlock(t, url, "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "reports/zk") || !strings.Contains(r.stdout, pid) || !strings.Contains(r.stdout, "TOKEN") {
		t.Fatalf("ls on zookeeper: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runDlock(t, url, "ls", "--json", "reports/")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 || infos[0].Key != "reports/zk" || infos[0].Token <= last || infos[0].Metadata["pid"] != pid {
		t.Fatalf("ls --json on zookeeper: %v %q %q", err, r.stdout, r.stderr)
	}
	if r := runDlock(t, url, "ls", "--json", "nomatch/"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty ls --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// The locks live under the URL's path, nowhere else.
	c := zkClient(t, srv.Addr())
	if ok, _, err := c.Exists("/cli/locks/" + zklock.EscapeKey("reports/zk")); err != nil || !ok {
		t.Fatalf("no znode for the lock under /cli/locks: %v %v", ok, err)
	}
	if ok, _, err := c.Exists(zklock.DefaultPrefix); err != nil || ok {
		t.Fatalf("%s was created: %v %v", zklock.DefaultPrefix, ok, err)
	}
	if r := runDlock(t, url, "run", "-n", "reports/zk", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "pid="+pid) {
		t.Fatalf("conflict on zookeeper: %d %q", r.code, r.stderr)
	}
	if r := runDlock(t, url, "run", "-w", "300ms", "reports/zk", "--", "true"); r.code != exitConflict || !strings.Contains(r.stderr, "gave up") {
		t.Fatalf("-w on a held key on zookeeper: %d %q", r.code, r.stderr)
	}
	// A waiter queues behind the holder and gets the key once it ends.
	waiter := dlockCmd(context.Background(), url, "run", "reports/zk", "--", "sh", "-c", `echo "got $DLOCK_TOKEN"`)
	wout := &syncBuffer{}
	waiter.Stdout, waiter.Stderr = wout, wout
	waiter.WaitDelay = 5 * time.Second
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCmd(t, waiter) })
	// ls shows it queued: --json and the table's WAITERS column.
	deadline := time.Now().Add(hang)
	for {
		r := runDlock(t, url, "ls", "--json", "reports/zk")
		infos = nil
		if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 {
			t.Fatalf("ls --json with a waiter: %v %q %q", err, r.stdout, r.stderr)
		}
		if infos[0].Waiters == 1 && infos[0].Metadata["pid"] == pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hang: ls never showed the waiter: %q", r.stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r = runDlock(t, url, "ls")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != lsHeader ||
		len(f) < 10 || f[0] != "reports/zk" || f[1] != "exclusive" || f[7] != "-" || holderPID(f[2]) != pid || f[5] != "-" || f[6] != "1" || !strings.HasSuffix(lines[1], `"cmd=dlock run"`) {
		t.Fatalf("ls table with a waiter (no lease known to others: TTL -): %q", r.stdout)
	}
	holder.Process.Signal(syscall.SIGTERM)
	waitExit(t, holder)
	if code := waitExit(t, waiter); code != 0 || !strings.Contains(wout.String(), "got ") {
		t.Fatalf("waiter: exit %d %q", code, wout.String())
	}
	// The holder's node deleted behind its back: CMD is terminated, exit 4.
	doomed, errb, _ := background(t, url, "run", "--grace", "500ms", "doomed", "--", "sh", "-c", "echo started; exec sleep 60")
	dir := "/cli/locks/" + zklock.EscapeKey("doomed")
	kids, _, err := c.Children(dir)
	if err != nil || len(kids) != 1 {
		t.Fatalf("queue of doomed: %v %v", kids, err)
	}
	if err := c.Delete(path.Join(dir, kids[0]), -1); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, doomed); code != exitLost || !strings.Contains(errb.String(), "LOCK LOST") {
		t.Fatalf("exit %d after the node was deleted, want %d; stderr %q", code, exitLost, errb.String())
	}
}

// Digest auth: the right user:password creates the znodes readable and
// writable by that identity only; a wrong password (which ZooKeeper does
// not refuse at connect time) or none is refused with a message that says
// to check the credentials; no password is ever printed.
func TestZooKeeperDigestAuth(t *testing.T) {
	t.Parallel()
	srv := sharedZooKeeper(t) // /secure is its own
	const right, wrong = "rightPw1234", "wrongPw5678"
	good := "zk://alice:" + right + "@" + srv.Addr() + "/secure/locks"
	r := runDlock(t, good, "run", "k", "--", "sh", "-c", `echo "token $DLOCK_TOKEN"`)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "token ") {
		t.Fatalf("right password: %d %q %q", r.code, r.stdout, r.stderr)
	}
	background(t, good, "run", "held", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, good, "ls", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"key": "held"`) {
		t.Fatalf("ls with the right password: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// The znodes are alice's alone.
	c := zkClient(t, srv.Addr())
	if _, _, err := c.Children("/secure"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("an anonymous client read /secure: %v", err)
	}

	refused := [][]string{
		{"run", "k", "--", "true"},
		{"run", "-n", "--verbose", "held", "--", "true"},
		{"ls"},
		{"ls", "--json", "--verbose"},
	}
	bad := map[string][][]string{
		"zk://alice:" + wrong + "@" + srv.Addr() + "/secure/locks": refused,
		"zk://" + srv.Addr() + "/secure/locks":                     refused,
		// Nothing to read there yet (ls finds no locks), but creating
		// under /secure is refused.
		"zk://alice:" + wrong + "@" + srv.Addr() + "/secure/other": refused[:2],
	}
	for u, cmds := range bad {
		for _, args := range cmds {
			r := runDlock(t, u, args...)
			if r.code != exitBackend || !strings.Contains(r.stderr, "not authorized") || !strings.Contains(r.stderr, "check the credentials") {
				t.Errorf("%s %v: exit %d %q, want %d, not authorized and check the credentials", redact(u), args, r.code, r.stderr, exitBackend)
			}
			if out := r.stdout + r.stderr; strings.Contains(out, wrong) || strings.Contains(out, right) {
				t.Errorf("%s %v printed a password:\n%s", redact(u), args, out)
			}
		}
	}
	// Right password, everything printed: no password either.
	for _, args := range [][]string{
		{"run", "--verbose", "k", "--", "true"},
		{"run", "-n", "--verbose", "held", "--", "true"},
		{"ls", "--verbose"},
		{"ls", "--json", "--verbose"},
	} {
		r := runDlock(t, good, args...)
		if out := r.stdout + r.stderr; strings.Contains(out, right) || !strings.Contains(out, "zookeeper: ") && strings.Contains(strings.Join(args, " "), "verbose") {
			t.Errorf("%v: want the client's logs and no password:\n%s", args, out)
		}
	}
}

// An unreachable ensemble (closed loopback ports) or one that accepts
// connections and never answers is a backend error within
// --connect-timeout, never "held".
func TestZooKeeperUnreachable(t *testing.T) {
	t.Parallel()
	dead := "zk://" + deadAddr(t) + "," + deadAddr(t) + "/app"
	silent := "zk://" + silentServer(t)
	// The refusal is the client's, logged once it has tried a server:
	// time for that on a loaded machine.
	for _, c := range []struct {
		url, want string
		timeout   time.Duration
	}{
		{dead, "connection refused", 3 * time.Second},
		{silent, "no answer", time.Second},
	} {
		for i, args := range [][]string{
			{"run", "--connect-timeout", c.timeout.String(), "k", "--", "true"},
			{"run", "-n", "--connect-timeout", c.timeout.String(), "k", "--", "true"},
			{"run", "-w", "1s", "--connect-timeout", c.timeout.String(), "k", "--", "true"},
			{"ls", "--connect-timeout", c.timeout.String()},
		} {
			t.Run(fmt.Sprintf("%s/%d", c.want, i), func(t *testing.T) {
				t.Parallel()
				r, took := timedRun(t, c.url, args...)
				if r.code != exitBackend || !strings.Contains(r.stderr, "not reachable") || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, "is held") {
					t.Errorf("%s %v: exit %d %q, want %d, not reachable and %q", c.url, args, r.code, r.stderr, exitBackend, c.want)
				}
				withinBound(t, fmt.Sprintf("%s %v", c.url, args), took, c.timeout)
			})
		}
	}
}

// The demo on ZooKeeper: worker A's lease is its session's (a short one
// here), B gets the key once the server expires A's session, and A, once
// resumed, takes the key again although its client has to reconnect.
func TestDemoOnZooKeeper(t *testing.T) {
	t.Parallel()
	srv := sharedZooKeeper(t) // /demo is its own
	r := runDlock(t, "", "demo", "--url", "zk://"+srv.Addr()+"/demo?session_timeout=4s", "--workers", "4", "--rounds", "5")
	for _, want := range []string{"expected 20: correct", "REJECTED by the guard", "retried under a new lock", "with fencing:    balance = 120"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("demo on zookeeper: exit %d, no %q\n%s\n%s", r.code, want, r.stdout, r.stderr)
		}
	}
}
