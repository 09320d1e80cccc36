package etcdtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/dlock-go/dlock/internal/testserver"
)

// serveEnv is the environment variable that makes Serve run an etcd
// member; its value is the member's processSpec as JSON.
const serveEnv = "DLOCK_ETCDTEST_SERVE"

// readyLine is what a child prints on its stdout once its member serves.
const readyLine = "dlock-etcdtest: ready"

// processStopTimeout bounds the wait for a killed child to exit.
const processStopTimeout = 10 * time.Second

// processSpec tells a child process which member to run.
type processSpec struct {
	Name      string `json:"name"`
	Dir       string `json:"dir"`
	ClientURL string `json:"client_url"`
	PeerURL   string `json:"peer_url"`
	// Cluster and Token are the initial cluster ("name=peerURL,...") and
	// its token when the member is one of several; empty for one member.
	Cluster string `json:"cluster,omitempty"`
	Token   string `json:"token,omitempty"`
}

// Serve turns this process into an etcd member when StartProcess started
// it, and then never returns: the member serves until the process is
// killed, its stdin is closed (the parent is gone) or it fails. Otherwise
// Serve returns at once. Call it first thing in the TestMain of every
// test package that uses StartProcess:
//
//	func TestMain(m *testing.M) {
//		etcdtest.Serve()
//		os.Exit(m.Run())
//	}
func Serve() {
	v := os.Getenv(serveEnv)
	if v == "" {
		return
	}
	os.Exit(serve(v))
}

func serve(v string) int {
	var spec processSpec
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest: bad %s: %v\n", serveEnv, err)
		return 2
	}
	cfg := NewConfig(spec.Name, spec.Dir, spec.ClientURL, spec.PeerURL)
	if spec.Cluster != "" {
		cfg.InitialCluster, cfg.InitialClusterToken = spec.Cluster, spec.Token
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest: start: %v\n", err)
		return 1
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcdtest: %v\n", err)
		return 1
	case <-time.After(StartTimeout):
		fmt.Fprintf(os.Stderr, "etcdtest: not ready within %v\n", StartTimeout)
		return 1
	}
	fmt.Println(readyLine)
	// The parent holds our stdin open; EOF means it is gone (a backstop
	// for the parent-death signal, which Linux ties to the forking thread).
	parentGone := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(parentGone) }()
	select {
	case <-parentGone:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcdtest: %v\n", err)
		return 1
	}
}

// Process is a one-member etcd cluster running in a child process, so a
// test can pause it (SIGSTOP: connections stay open, requests hang, as for
// a stalled VM) and kill it.
type Process struct {
	t         testserver.TB
	dir       string
	clientURL string
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	exited    chan struct{} // closed once the child has exited and been reaped

	mu      sync.Mutex
	stopped bool
}

// StartProcess starts a one-member etcd cluster in a child process (this
// test binary re-executed; its TestMain must call Serve first) on free
// loopback ports, waits until it serves (at most StartTimeout) and stops it
// (SIGKILL and wait) at t.Cleanup. The child's data and logs (etcd.log,
// stderr.log) are kept in a temporary directory of the test, and the child
// is killed if the test process dies.
func StartProcess(t testserver.TB) *Process {
	t.Helper()
	ps := startProcesses(t, 1)
	return ps[0]
}

// StartProcesses starts an n-member etcd cluster, each member in a child
// process as StartProcess does, and waits until every member serves. The
// members are separate processes, as a real cluster's are: a test process
// busy with many clients (and the race detector) does not hold up the
// members' heartbeats and replies. Each is stopped at t.Cleanup.
func StartProcesses(t testserver.TB, n int) []*Process {
	t.Helper()
	return startProcesses(t, n)
}

func startProcesses(t testserver.TB, n int) []*Process {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	var errs []error
	for attempt := 0; attempt < 3; attempt++ { // a free port may be taken meanwhile
		ps, err := launchCluster(t, exe, n)
		if err == nil {
			return ps
		}
		errs = append(errs, err)
	}
	t.Fatalf("etcd process did not start: %v", errs)
	return nil
}

// launchCluster starts n children on fresh ports (all at once: a member
// of several is ready only once a quorum runs) and waits until each is
// ready; on an error every child started is stopped.
func launchCluster(t testserver.TB, exe string, n int) ([]*Process, error) {
	specs := make([]processSpec, n)
	dirs := make([]string, n)
	var initial []string
	for i := range specs {
		dirs[i] = t.TempDir()
		specs[i] = processSpec{
			Name:      fmt.Sprintf("p%d", i),
			Dir:       filepath.Join(dirs[i], "etcd"),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testserver.FreePort(t)),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", testserver.FreePort(t)),
		}
		initial = append(initial, specs[i].Name+"="+specs[i].PeerURL)
	}
	if n > 1 {
		token := fmt.Sprintf("dlock-test-%d", time.Now().UnixNano())
		for i := range specs {
			specs[i].Cluster, specs[i].Token = strings.Join(initial, ","), token
		}
	}
	var (
		ps     []*Process
		readys []chan struct{}
	)
	stopAll := func() {
		for _, p := range ps {
			p.Stop()
		}
	}
	for i, spec := range specs {
		p, ready, err := launchProcess(t, exe, dirs[i], spec)
		if err != nil {
			stopAll()
			return nil, err
		}
		ps, readys = append(ps, p), append(readys, ready)
	}
	timeout := time.After(StartTimeout)
	for i, p := range ps {
		select {
		case <-readys[i]:
		case <-p.exited:
			err := fmt.Errorf("child exited at start (%v; does TestMain call etcdtest.Serve first?): %s",
				p.cmd.ProcessState, p.logTail())
			stopAll()
			return nil, err
		case <-timeout:
			err := fmt.Errorf("not ready within %v: %s", StartTimeout, p.logTail())
			stopAll()
			return nil, err
		}
	}
	return ps, nil
}

// launchProcess starts the child that serves spec, its files in dir, and
// returns it with a channel closed once it is ready.
func launchProcess(t testserver.TB, exe, dir string, spec processSpec) (*Process, chan struct{}, error) {
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(spec.Dir, 0o700); err != nil {
		return nil, nil, err
	}
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, nil, err
	}
	defer stderr.Close() // the child has its own copy
	out, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	// -test.run matches nothing: a binary whose TestMain does not call
	// Serve runs no test and exits, which is reported below.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+string(js))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = outW, stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		out.Close()
		outW.Close()
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		out.Close()
		outW.Close()
		return nil, nil, err
	}
	outW.Close()
	p := &Process{t: t, dir: dir, clientURL: spec.ClientURL, cmd: cmd, stdin: stdin,
		exited: make(chan struct{})}
	ready := make(chan struct{})
	// One goroutine per child: it watches stdout for the ready line,
	// drains it until the child exits (EOF), then reaps the child.
	go func() {
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			if !seen && sc.Text() == readyLine {
				seen = true
				close(ready)
			}
		}
		io.Copy(io.Discard, out) // a line too long for the scanner
		out.Close()
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.Stop)
	return p, ready, nil
}

// ProcessEndpoints are the client URLs of ps.
func ProcessEndpoints(ps []*Process) []string {
	eps := make([]string, len(ps))
	for i, p := range ps {
		eps[i] = p.ClientURL()
	}
	return eps
}

// ClientURL is the member's client URL, http://127.0.0.1:port.
func (p *Process) ClientURL() string { return p.clientURL }

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Dir is the test's temporary directory that holds the member's data
// (etcd/) and logs (etcd/etcd.log, stderr.log).
func (p *Process) Dir() string { return p.dir }

// pauseTimeout bounds how long Pause waits for every thread of the child
// to stop.
const pauseTimeout = 10 * time.Second

// Pause stops the child (SIGSTOP): its connections stay open and requests
// to it hang until Resume. It returns once every thread of the child has
// stopped (on Linux), so no request sent after it is served.
func (p *Process) Pause() {
	p.signal(syscall.SIGSTOP)
	end := time.Now().Add(pauseTimeout)
	for !p.killed() && !stopped(p.Pid()) {
		if time.Now().After(end) {
			p.t.Errorf("etcd process %d: not stopped %v after SIGSTOP", p.Pid(), pauseTimeout)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume continues a paused child (SIGCONT).
func (p *Process) Resume() { p.signal(syscall.SIGCONT) }

// killed reports whether Stop was called.
func (p *Process) killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Errorf("etcd process %d: %v: %v", p.cmd.Process.Pid, sig, err)
	}
}

// Stop kills the child (SIGKILL, which also ends a paused one) and waits
// for it to exit. It is idempotent and runs at the test's cleanup.
func (p *Process) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(processStopTimeout):
		p.t.Errorf("etcd process %d did not exit within %v of SIGKILL", p.cmd.Process.Pid, processStopTimeout)
	}
	p.stdin.Close()
}

// logTail is the end of the child's stderr and etcd log, for errors.
func (p *Process) logTail() string {
	var b bytes.Buffer
	for _, name := range []string{"stderr.log", filepath.Join("etcd", "etcd.log")} {
		data, _ := os.ReadFile(filepath.Join(p.dir, name))
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		if data = bytes.TrimSpace(data); len(data) > 0 {
			fmt.Fprintf(&b, "[%s] %s\n", name, data)
		}
	}
	return b.String()
}
