// Package testserver starts real servers (redis-server, ...) on free
// loopback ports for tests and stops them when the test ends. Servers bind
// 127.0.0.1 only. A missing binary fails the test with a message naming
// `make deps` when the CI environment variable is set, and skips it
// otherwise.
package testserver

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TB is the part of testing.TB the servers need, so that programs (the
// benchmark report) can start servers too. *testing.T and *testing.B
// satisfy it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
}

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 20 * time.Second

// Binary returns the path of a server binary, or fails (CI) / skips the test.
func Binary(t TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/bin", "/usr/bin"} {
		if p := filepath.Join(dir, name); isExec(p) {
			return p
		}
	}
	missing(t, name+" (in PATH)", "")
	return ""
}

// missing fails the test (CI) or skips it, naming `make deps` and the
// Debian package that brings what is missing.
func missing(t TB, what, pkg string) {
	t.Helper()
	from := "Debian's " + pkg + " package"
	if pkg == "" {
		from = "its Debian package"
	}
	msg := fmt.Sprintf("%s not found: run `make deps` (installs %s as root)", what, from)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// Redis is a redis-server process owned by a test.
type Redis struct {
	t        TB
	bin      string
	dir      string
	port     int
	password string
	extra    []string
	conf     string // a config file to start from (redis-sentinel's)
	cmd      *exec.Cmd
	exited   chan struct{}
	paused   bool
}

// RedisOption configures StartRedis.
type RedisOption func(*Redis)

// WithPassword makes the server require a password.
func WithPassword(pw string) RedisOption { return func(r *Redis) { r.password = pw } }

// WithArgs passes extra redis-server arguments ("--maxmemory", "1mb").
func WithArgs(args ...string) RedisOption {
	return func(r *Redis) { r.extra = append(r.extra, args...) }
}

// StartRedis starts redis-server without persistence on a free loopback
// port and registers its shutdown with t.Cleanup.
func StartRedis(t TB, opts ...RedisOption) *Redis {
	t.Helper()
	r := &Redis{t: t, bin: Binary(t, "redis-server"), dir: t.TempDir()}
	for _, o := range opts {
		o(r)
	}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		r.port = FreePort(t)
		if err = r.start(); err == nil {
			t.Cleanup(r.Stop)
			return r
		}
	}
	t.Fatalf("redis-server did not start: %v", err)
	return nil
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port is the server's TCP port.
func (r *Redis) Port() int { return r.port }

// Password is the server's password, if any.
func (r *Redis) Password() string { return r.password }

// LogPath is the server's log file.
func (r *Redis) LogPath() string { return filepath.Join(r.dir, "redis.log") }

func (r *Redis) start() error {
	args := []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", r.dir, "--logfile", r.LogPath(),
	}
	if r.conf != "" {
		// redis-sentinel: its monitored masters are in the config file,
		// which it rewrites; it takes no persistence options.
		args = []string{r.conf, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
			"--daemonize", "no", "--dir", r.dir, "--logfile", r.LogPath()}
	}
	if r.password != "" {
		args = append(args, "--requirepass", r.password)
	}
	args = append(args, r.extra...)
	cmd := exec.Command(r.bin, args...)
	cmd.SysProcAttr = serverProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	r.cmd, r.exited, r.paused = cmd, exited, false
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("exited at start: %s", r.logTail())
		default:
		}
		if err := r.ping(); err == nil && r.servedBy(cmd.Process.Pid) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.kill()
	return fmt.Errorf("not ready after %v: %s", startTimeout, r.logTail())
}

// servedBy reports whether the process answering on r's port is pid. A
// port free a moment ago (FreePort) may have been taken meanwhile by a
// server of a test running in parallel: that one answers PING while ours,
// which failed to bind the port, exits (start then tries another port).
func (r *Redis) servedBy(pid int) bool {
	info, err := r.Do("INFO", "server")
	v, ok := infoField(info, "process_id")
	return err == nil && ok && v == strconv.Itoa(pid)
}

// ping checks the server answers PING.
func (r *Redis) ping() error {
	reply, err := r.Do("PING")
	if err == nil && reply != "PONG" {
		err = fmt.Errorf("ping: %q", reply)
	}
	return err
}

// Do sends one command over a fresh connection (after AUTH when a password
// is set) and returns a simple, integer or bulk-string reply as a string,
// and an array as its elements joined by newlines. An error reply is
// returned as an error.
func (r *Redis) Do(args ...string) (string, error) {
	replies, err := r.DoSeq(args)
	if err != nil {
		return "", err
	}
	return replies[0], nil
}

// DoSeq sends commands one after another over one fresh connection (WAIT
// counts the replicas that have the writes of its own connection) and
// returns their replies as Do does, stopping at the first error.
func (r *Redis) DoSeq(cmds ...[]string) ([]string, error) {
	c, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if r.password != "" {
		if _, err := roundTrip(c, br, "AUTH", r.password); err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
	}
	var replies []string
	for _, args := range cmds {
		reply, err := roundTrip(c, br, args...)
		if err != nil {
			return replies, err
		}
		replies = append(replies, reply)
	}
	return replies, nil
}

func roundTrip(c net.Conn, br *bufio.Reader, args ...string) (string, error) {
	if err := writeCommand(c, args...); err != nil {
		return "", err
	}
	return readReply(br)
}

// writeCommand sends one command as a RESP array of bulk strings.
func writeCommand(w io.Writer, args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// readReply reads one reply as roundTrip returns it.
func readReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		elems := make([]string, 0, n)
		for i := 0; i < n; i++ {
			e, err := readReply(br)
			if err != nil {
				return "", err
			}
			elems = append(elems, e)
		}
		return strings.Join(elems, "\n"), nil
	}
	return "", fmt.Errorf("unsupported reply %q", line)
}

func (r *Redis) logTail() string {
	b, _ := os.ReadFile(r.LogPath())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

func (r *Redis) signal(sig syscall.Signal) {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(sig)
	}
}

// Pause stops the server process (SIGSTOP): connections stay open and
// requests hang, as during a long GC pause or a stalled VM.
func (r *Redis) Pause() {
	r.signal(syscall.SIGSTOP)
	r.paused = true
	// Every thread stopped (redis-server has background threads): until
	// then, on a loaded machine, the server may go on answering.
	if r.cmd != nil && r.cmd.Process != nil {
		if err := waitStopped(r.cmd.Process.Pid, 30*time.Second); err != nil {
			r.t.Fatalf("redis pause: %v", err)
		}
	}
}

// Resume continues a paused server (SIGCONT).
func (r *Redis) Resume() { r.signal(syscall.SIGCONT); r.paused = false }

func (r *Redis) kill() {
	if r.cmd == nil {
		return
	}
	r.signal(syscall.SIGKILL)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		r.t.Errorf("redis-server pid %d did not exit after SIGKILL", r.cmd.Process.Pid)
	}
	r.cmd = nil
}

// Stop kills the server and waits for it to exit. It is idempotent.
func (r *Redis) Stop() { r.kill() }

// Restart kills the server (losing all data: persistence is off) and starts
// it again on the same port.
func (r *Redis) Restart() {
	r.t.Helper()
	r.kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = r.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("redis-server restart on port %d: %v", r.port, err)
}

// StartRedisCluster starts n (≥ 3) cluster-enabled redis-servers, splits
// the 16384 slots between them, joins them and waits until every node
// reports cluster_state:ok. opts apply to every node. It returns the
// nodes; clients may be given any of their addresses.
func StartRedisCluster(t TB, n int, opts ...RedisOption) []*Redis {
	t.Helper()
	if n < 3 {
		t.Fatalf("StartRedisCluster: need at least 3 masters, got %d", n)
	}
	nodes := make([]*Redis, n)
	for i := range nodes {
		dir := t.TempDir()
		nodes[i] = StartRedis(t, append([]RedisOption{WithArgs("--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000")}, opts...)...)
	}
	const slots = 16384
	for i, nd := range nodes {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if _, err := nd.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			t.Fatalf("cluster addslots on %s: %v", nd.Addr(), err)
		}
	}
	for _, nd := range nodes[1:] {
		if _, err := nodes[0].Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(nd.Port())); err != nil {
			t.Fatalf("cluster meet %s: %v", nd.Addr(), err)
		}
	}
	deadline := time.Now().Add(startTimeout)
	for _, nd := range nodes {
		for {
			info, err := nd.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster did not converge within %v: %s %v", startTimeout, info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// Long marks a test that runs in `make test-long` only: under -short
// (`make test`) it is skipped with why, which says what makes it long
// (scale, a failover matrix, repetition). A test is long for its cost,
// never to hide a flake: a flaky test is fixed where it is.
func Long(t TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("long test (make test-long): " + why)
	}
}
