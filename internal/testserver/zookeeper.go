package testserver

import (
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
	"time"
)

// ZooKeeperJar is the server jar of Debian's zookeeper package.
const ZooKeeperJar = "/usr/share/java/zookeeper.jar"

// ZooKeeperTick is the tickTime of the servers StartZooKeeper starts: the
// session timeouts they grant are 2 ticks (400ms) to 60s.
const ZooKeeperTick = 200 * time.Millisecond

// ZooKeeper is one ZooKeeper server process (standalone or an ensemble
// member) owned by a test: its own config, data directory and loopback
// ports. Four-letter-word commands are all enabled, and empty container
// nodes are removed within a second (the default is a minute).
type ZooKeeper struct {
	t      TB
	java   string
	id     int
	port   int
	dir    string
	cfg    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// zkJava returns the java binary, after checking the ZooKeeper jar is
// installed (failing under CI, skipping otherwise, naming `make deps`).
func zkJava(t TB) string {
	t.Helper()
	java := Binary(t, "java")
	if !isFile(ZooKeeperJar) {
		missing(t, ZooKeeperJar, "zookeeper")
	}
	return java
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// StartZooKeeper starts a standalone ZooKeeper server on a free loopback
// port and stops it when the test ends.
func StartZooKeeper(t TB) *ZooKeeper {
	t.Helper()
	java := zkJava(t)
	z := &ZooKeeper{t: t, java: java, port: FreePort(t), dir: t.TempDir()}
	z.writeConfig(nil)
	if err := z.start(); err != nil {
		t.Fatalf("zookeeper: %v", err)
	}
	t.Cleanup(z.Stop)
	return z
}

// StartZooKeeperEnsemble starts n (3 or 5) ZooKeeper servers as one
// ensemble on loopback ports and waits until it has a leader and every
// member serves clients.
func StartZooKeeperEnsemble(t TB, n int) []*ZooKeeper {
	t.Helper()
	if n < 3 {
		t.Fatalf("StartZooKeeperEnsemble: need at least 3 members, got %d", n)
	}
	java := zkJava(t)
	nodes := make([]*ZooKeeper, n)
	var peers []string
	for i := range nodes {
		nodes[i] = &ZooKeeper{t: t, java: java, id: i + 1, port: FreePort(t), dir: t.TempDir()}
		peers = append(peers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d;127.0.0.1:%d", i+1, FreePort(t), FreePort(t), nodes[i].port))
	}
	for _, z := range nodes {
		z.writeConfig(peers)
		if err := os.WriteFile(filepath.Join(z.dir, "data", "myid"), []byte(strconv.Itoa(z.id)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := z.boot(); err != nil {
			t.Fatalf("zookeeper %d: %v", z.id, err)
		}
		t.Cleanup(z.Stop)
	}
	for _, z := range nodes {
		if err := z.waitServing(); err != nil {
			t.Fatalf("zookeeper ensemble member %d: %v", z.id, err)
		}
	}
	return nodes
}

func (z *ZooKeeper) writeConfig(peers []string) {
	if err := os.MkdirAll(filepath.Join(z.dir, "data"), 0o755); err != nil {
		z.t.Fatal(err)
	}
	lines := []string{
		"tickTime=" + strconv.Itoa(int(ZooKeeperTick/time.Millisecond)),
		"dataDir=" + filepath.Join(z.dir, "data"),
		"clientPort=" + strconv.Itoa(z.port),
		"clientPortAddress=127.0.0.1",
		"admin.enableServer=false",
		"4lw.commands.whitelist=*",
		"maxClientCnxns=0",
		"maxSessionTimeout=60000",
		"autopurge.purgeInterval=0",
	}
	if peers != nil {
		lines = append(lines, "initLimit=10", "syncLimit=5", "standaloneEnabled=false", "reconfigEnabled=false")
		lines = append(lines, peers...)
	}
	z.cfg = filepath.Join(z.dir, "zoo.cfg")
	if err := os.WriteFile(z.cfg, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		z.t.Fatal(err)
	}
}

// LogPath is the server's console output.
func (z *ZooKeeper) LogPath() string { return filepath.Join(z.dir, "zookeeper.out") }

func (z *ZooKeeper) launch() error {
	out, err := os.OpenFile(z.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	main := "org.apache.zookeeper.server.ZooKeeperServerMain"
	if z.id > 0 {
		main = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
	}
	cmd := exec.Command(z.java,
		"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
		"-Dzookeeper.log.dir="+z.dir,
		"-Dznode.container.checkIntervalMs=500",
		"-Dznode.container.maxPerMinute=1000000",
		"-Dzookeeper.forceSync=no",
		"-cp", classPath(), main, z.cfg)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = serverProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(exited) }()
	z.cmd, z.exited = cmd, exited
	return nil
}

func (z *ZooKeeper) start() error {
	if err := z.boot(); err != nil {
		return err
	}
	return z.waitServing()
}

// bootTimeout bounds how long a server holds the machine's boot lock
// (lockBoot); bootWait how long one waits for it: a dozen boots of about
// a second each, on a loaded machine a few seconds.
const (
	bootTimeout = startTimeout
	bootWait    = 4 * startTimeout
)

// boot launches the server and returns once its client port accepts
// connections (which a quorum member does before its election), or it
// exited, or bootTimeout passed: the caller's waitServing reports those.
// No other server of the machine's tests boots meanwhile. A JVM spends
// most of a second of CPU in its first second, on a dozen runnable
// threads (class loading, compiling), and zklock's tests launch seven at
// once (an ensemble, a standalone server and a leader-election test):
// together they fill a 2-core machine's run queue for seconds, beside
// servers and test processes whose leases are 4 s. One boot at a time
// costs each server its own boot in wall time and spreads that CPU out.
func (z *ZooKeeper) boot() error {
	defer lockBoot()()
	if err := z.launch(); err != nil {
		return err
	}
	for end := time.Now().Add(bootTimeout); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		select {
		case <-z.exited:
			return nil
		default:
		}
		if c, err := net.DialTimeout("tcp", z.Addr(), time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	return nil
}

// waitServing waits until the server answers "ruok" with "imok" and reports
// a mode (it serves clients: standalone, leader or follower).
func (z *ZooKeeper) waitServing() error {
	deadline := time.Now().Add(2 * startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-z.exited:
			return fmt.Errorf("exited at start: %s", z.logTail())
		default:
		}
		if m, err := z.Mode(); err == nil && m != "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	z.kill()
	return fmt.Errorf("not serving after %v: %s", 2*startTimeout, z.logTail())
}

// Addr is host:port of the server's client port.
func (z *ZooKeeper) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(z.port)) }

// ID is the member's id in its ensemble (0 for a standalone server).
func (z *ZooKeeper) ID() int { return z.id }

// FourLetter sends a four-letter-word command ("ruok", "srvr", "cons",
// "mntr", "wchc", ...) over a fresh connection and returns the reply.
func (z *ZooKeeper) FourLetter(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", z.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// Mode is the server's role as "srvr" reports it: "standalone", "leader"
// or "follower"; an error while it does not serve clients.
func (z *ZooKeeper) Mode() (string, error) {
	out, err := z.FourLetter("srvr")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("srvr: no mode in %q", out)
}

// ZooKeeperAddrs returns the members' client addresses.
func ZooKeeperAddrs(nodes []*ZooKeeper) []string {
	addrs := make([]string, len(nodes))
	for i, z := range nodes {
		addrs[i] = z.Addr()
	}
	return addrs
}

// ZooKeeperLeader returns the member that reports itself leader, or nil.
func ZooKeeperLeader(nodes []*ZooKeeper) *ZooKeeper {
	for _, z := range nodes {
		if z.cmd == nil {
			continue
		}
		if m, err := z.Mode(); err == nil && m == "leader" {
			return z
		}
	}
	return nil
}

func (z *ZooKeeper) logTail() string {
	b, _ := os.ReadFile(z.LogPath())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

func (z *ZooKeeper) signal(sig syscall.Signal) {
	if z.cmd != nil && z.cmd.Process != nil {
		_ = z.cmd.Process.Signal(sig)
	}
}

// Pause stops the server process (SIGSTOP) and returns once every thread
// of it has stopped: connections stay open and requests hang. (The kernel
// acts on a process-directed SIGSTOP when one of the JVM's threads next
// runs; until then, on a loaded machine, the server goes on answering.)
func (z *ZooKeeper) Pause() {
	z.signal(syscall.SIGSTOP)
	if z.cmd != nil && z.cmd.Process != nil {
		if err := waitStopped(z.cmd.Process.Pid, 30*time.Second); err != nil {
			z.t.Fatalf("zookeeper pause: %v", err)
		}
	}
}

// Resume continues a paused server (SIGCONT).
func (z *ZooKeeper) Resume() { z.signal(syscall.SIGCONT) }

func (z *ZooKeeper) kill() {
	if z.cmd == nil {
		return
	}
	z.signal(syscall.SIGKILL)
	select {
	case <-z.exited:
	case <-time.After(10 * time.Second):
		z.t.Errorf("zookeeper pid %d did not exit after SIGKILL", z.cmd.Process.Pid)
	}
	z.cmd = nil
}

// Stop kills the server (SIGKILL) and waits for it to exit. It is
// idempotent. Its data directory stays, so Start brings it back with its
// data.
func (z *ZooKeeper) Stop() { z.kill() }

// Start starts a stopped server again on the same ports and data; an
// ensemble member rejoins its ensemble.
func (z *ZooKeeper) Start() {
	z.t.Helper()
	if z.cmd != nil {
		return
	}
	var err error
	for attempt := 0; attempt < 20; attempt++ { // the port may linger briefly
		if err = z.start(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	z.t.Fatalf("zookeeper restart on port %d: %v", z.port, err)
}

// slf4jSimple, when installed (libslf4j-java), gives the server a logger:
// without one its log (LogPath) holds nothing but SLF4J's warning.
const slf4jSimple = "/usr/share/java/slf4j-simple.jar"

func classPath() string {
	if isFile(slf4jSimple) {
		return ZooKeeperJar + string(os.PathListSeparator) + slf4jSimple
	}
	return ZooKeeperJar
}
