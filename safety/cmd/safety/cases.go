package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/safety/history"
)

// caseSpec is one cell of the matrix: a backend deployment and a fault.
type caseSpec struct {
	backend string
	fault   string
	ttl     time.Duration // the workers' lock TTL
	dur     time.Duration // how long the workers run
	pauses  int           // how many times the fault is injected
}

// think is the time a worker spends between its read and its write. A
// fault on the server side only matters while a worker is inside its
// critical section, so those cases use long sections (half the TTL): a
// restart or a clock jump then almost always catches a holder mid-work.
// Client-side faults stop the worker inside its section themselves.
func (c caseSpec) think() time.Duration {
	switch c.fault {
	case "none", "client-pause", "kill-holder":
		return 5 * time.Millisecond
	case "failover", "failover-lagging":
		// The fault is injected right after a grant (see injectFailover);
		// a section of 6 s (renewed meanwhile) outlasts a failover (about
		// 2.5 s here), so the holder is still at work when the new
		// primary starts granting.
		return 6 * time.Second
	}
	return c.ttl / 2
}

func (c caseSpec) name() string { return c.backend + "/" + c.fault }

// semPermits is the limit of the semaphore rows (WithLimit): half the
// default 4 workers, so that a paused holder's permit, freed at its
// expiry, is taken by a worker that was waiting. The matrix notes
// (report.go) say 2.
const semPermits = 2

// prim is the lock primitive the case's workers use, from the backend's
// suffix: "rw" (redis-rw, etcd-rw: even workers write under an exclusive
// lock, odd ones read under dlock.WithShared), "sem" (redis-sem,
// etcd-sem: every worker holds one of semPermits permits,
// dlock.WithLimit) or "" (an exclusive lock).
func (c caseSpec) prim() string {
	for _, p := range []string{"rw", "sem"} {
		if strings.HasSuffix(c.backend, "-"+p) {
			return p
		}
	}
	return ""
}

// base is the backend's deployment without the primitive's suffix.
func (c caseSpec) base() string {
	if p := c.prim(); p != "" {
		return strings.TrimSuffix(c.backend, "-"+p)
	}
	return c.backend
}

// workerMode is worker id's lock mode (its -mode flag) and, for a
// semaphore, the permits.
func (c caseSpec) workerMode(id int) (mode string, limit int) {
	switch c.prim() {
	case "rw":
		if id%2 == 1 {
			return "shared", 0
		}
	case "sem":
		return "limited", semPermits
	}
	return "exclusive", 0
}

// faults, by name, with what they do (for the report).
var faultDoc = map[string]string{
	"none":             "no fault (baseline)",
	"client-pause":     "a worker stops itself (SIGSTOP) between its fenced read and its write, while it believes it holds the lock, for 3×TTL; then SIGCONT",
	"server-pause":     "the server (Redlock: a majority of nodes; a ZooKeeper ensemble: its leader; PostgreSQL: the postmaster and every backend) is stopped with SIGSTOP for 3×TTL: connections stay open, requests hang",
	"restart-volatile": "the server is killed (SIGKILL) and restarted at once with no persistence: every lock is forgotten",
	"restart-aof":      "the server is killed (SIGKILL) and restarted at once with appendonly yes, appendfsync always",
	"restart":          "the server is killed (SIGKILL: PostgreSQL's postmaster and every backend, a crash) and started again at once on the same data directory; crash recovery replays the WAL, so every acknowledged commit survives",
	"partition-client": "one worker's link to the server is stalled (fault proxy: bytes stop flowing both ways, the connection stays open) for 3×TTL",
	"partition-server": "one Redlock node of 3 is cut off from every client (its fault proxy stalls: requests hang, connections stay open) for 3×TTL",
	"kleppmann":        "Kleppmann's Redlock scenario: node C is cut off (connections refused) for one TTL, so holders take A and B only; then B is restarted without persistence and C is healed: a majority (B, C) no longer knows the holder",
	"lost-replies":     "for 3×TTL, every TTL/4 one request of one worker (acquire, renewal or release) takes effect on the server but its reply is lost and the connection reset (fault proxy)",
	"kleppmann-clock":  "Kleppmann's Redlock clock scenario: node C is cut off for one TTL, so holders take A and B only; then B's wall clock jumps 3×TTL forward (its copy of the lease expires) and C is healed",
	"restart-minority": "the Kleppmann scenario: one Redlock node of 3 (a minority) is killed and restarted without persistence while a lock is held",
	"kill-holder":      "a worker is killed (SIGKILL) between its fenced read and its write, while it holds the lock; a new worker replaces it",
	"clock-jump":       "the Redis server's wall clock jumps 3×TTL forward (LD_PRELOAD shim, safety/clock) and back to real time 3×TTL later",
	"kill-leader":      "the leader of a 3-member cluster is killed (SIGKILL); etcd: it stays down (two members keep a quorum); ZooKeeper: it is started again 3×TTL later with its data and rejoins as a follower",
	"failover":         "Sentinel (a primary, 2 replicas, 3 sentinels, down-after 1 s): right after a worker is granted the key and the replicas have the write, the primary is killed (SIGKILL) and stays down; the sentinels promote a replica and the workers' failover clients follow",
	"failover-lagging": "as failover, but first the replicas' replication links are stalled (fault proxies: they stay up, eligible for promotion, and miss every write from then on; redis-sentinel-acks: one replica's link of two, so the other can acknowledge); a TTL later (the lease held at the stall, the last the stalled replicas saw, has expired) the primary is killed right after a grant",
}

func allCases() []caseSpec {
	const ttl, dur, pauses = time.Second, 12 * time.Second, 3
	etcdTTL := 2 * time.Second // etcd's minimum lease
	return []caseSpec{
		{"redis", "none", ttl, dur, 0},
		{"redis", "client-pause", ttl, dur, pauses},
		{"redis", "server-pause", ttl, dur, 2},
		{"redis", "partition-client", ttl, dur, 2},
		{"redis", "lost-replies", ttl, dur, 1},
		{"redis", "restart-volatile", ttl, dur, pauses},
		{"redis-aof", "restart-aof", ttl, dur, pauses},
		{"redis-clock", "clock-jump", ttl, dur, 2},
		// redislock's Lua-free protocol: Tair's CAS and CAD, as a user
		// who may not run scripts; the plain redis row's faults.
		{"redis-tair", "none", ttl, dur, 0},
		{"redis-tair", "client-pause", ttl, dur, pauses},
		{"redis-tair", "server-pause", ttl, dur, 2},
		{"redis-tair", "partition-client", ttl, dur, 2},
		{"redis-tair", "lost-replies", ttl, dur, 1},
		{"redis-tair", "restart-volatile", ttl, dur, pauses},
		{"redlock", "none", ttl, dur, 0},
		{"redlock", "client-pause", ttl, dur, pauses},
		{"redlock", "server-pause", ttl, dur, 2},
		{"redlock", "partition-server", ttl, dur, 2},
		{"redlock", "restart-minority", ttl, dur, pauses},
		{"redlock", "kleppmann", ttl, dur, pauses},
		{"redlock", "kleppmann-clock", ttl, dur, 2},
		{"etcd", "none", etcdTTL, dur, 0},
		{"etcd", "client-pause", etcdTTL, 20 * time.Second, 2},
		{"etcd", "server-pause", etcdTTL, 20 * time.Second, 1},
		{"etcd3", "kill-leader", etcdTTL, 20 * time.Second, 1},
		{"zk", "none", ttl, dur, 0},
		{"zk", "client-pause", ttl, dur, pauses},
		{"zk", "server-pause", ttl, dur, 2},
		{"zk", "partition-client", ttl, dur, 2},
		{"zk", "lost-replies", ttl, dur, 1},
		{"zk3", "kill-leader", ttl, 20 * time.Second, 2},
		{"zk3", "server-pause", ttl, 15 * time.Second, 2},
		{"pg", "none", ttl, dur, 0},
		// 15 s: waiters race for a released row, so the worker chosen to
		// pause may wait a while for the key; 12 s fitted one pause only.
		{"pg", "client-pause", ttl, 15 * time.Second, pauses},
		{"pg", "server-pause", ttl, dur, 2},
		{"pg", "partition-client", ttl, dur, 2},
		{"pg", "lost-replies", ttl, dur, 1},
		{"pg", "restart", ttl, dur, pauses},
		{"pgbouncer", "client-pause", ttl, 15 * time.Second, pauses},
		{"file", "none", ttl, dur, 0},
		{"file", "client-pause", ttl, dur, pauses},
		{"file", "kill-holder", ttl, dur, pauses},
		// Read-write locks (writers paused) and semaphores (holders
		// paused), with their baselines.
		{"redis-rw", "none", ttl, dur, 0},
		{"redis-rw", "client-pause", ttl, dur, pauses},
		{"redis-sem", "none", ttl, dur, 0},
		{"redis-sem", "client-pause", ttl, dur, pauses},
		{"etcd-rw", "client-pause", etcdTTL, 20 * time.Second, 2},
		{"etcd-sem", "client-pause", etcdTTL, 20 * time.Second, 2},
		// Skipped while the Lua-free protocol grants exclusive locks
		// only (see unsupportedMode).
		{"redis-tair-rw", "client-pause", ttl, dur, pauses},
		{"redis-tair-sem", "client-pause", ttl, dur, pauses},
		// Sentinel failovers (one per case: the killed primary stays
		// down). A 20 s lease outlasts a failover and is first renewed
		// after 6.7 s, after the end of a 6 s section (think): a holder
		// learns that its lease is gone only when it releases. 65 s
		// leave room for the fault (failover-lagging waits a TTL after
		// the stall) and recovery after a third of the run.
		{"redis-sentinel", "failover", sentinelTTL, sentinelDur, 1},
		{"redis-sentinel", "failover-lagging", sentinelTTL, sentinelDur, 1},
		{"redis-sentinel-acks", "failover", sentinelTTL, sentinelDur, 1},
		{"redis-sentinel-acks", "failover-lagging", sentinelTTL, sentinelDur, 1},
	}
}

// The Sentinel rows' lease and run time.
const sentinelTTL, sentinelDur = 20 * time.Second, 65 * time.Second

func quickCases() []caseSpec {
	// Short leases so that several pauses fit: one pause that found no
	// other worker ready to take the key would leave the control blind.
	return []caseSpec{
		{"redis", "client-pause", 500 * time.Millisecond, 10 * time.Second, 3},
		{"file", "client-pause", 500 * time.Millisecond, 10 * time.Second, 3},
	}
}

// deployment is a backend's servers for one case, and what the faults act on.
type deployment struct {
	specs   []string // per worker: the backend spec it locks with
	redis   []*testserver.Redis
	proxies []*testserver.Proxy // per worker, for partition-client
	etcd    *etcdtest.Process
	etcd3   *etcdtest.Cluster
	zk      *testserver.ZooKeeper   // standalone
	zk3     []*testserver.ZooKeeper // an ensemble of 3
	pg      *testserver.Postgres    // also behind PgBouncer (pgbouncer)
	clocked *shimmedRedis
	fileDir string
	// sentinel is the Sentinel group of the redis-sentinel backends;
	// restoreSentinel (failover-lagging) lets its sentinels fix replicas'
	// configurations again (see testserver.Sentinel.KeepReplicationLinks).
	sentinel        *testserver.Sentinel
	restoreSentinel func()
	// noScriptsUser: the workers connect to redis[0] as the ACL user
	// testserver.NoScriptsUser (redis-tair).
	noScriptsUser bool
}

func deploy(t *tb, c caseSpec, workers int) *deployment {
	d := &deployment{}
	switch c.base() {
	case "redis", "redis-aof":
		var opts []testserver.RedisOption
		if c.backend == "redis-aof" {
			opts = append(opts, testserver.WithArgs("--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir()))
		}
		srv := testserver.StartRedis(t, opts...)
		d.redis = []*testserver.Redis{srv}
		for _, addr := range d.clientAddrs(t, c, workers, srv.Addr()) {
			d.specs = append(d.specs, "redis:"+addr)
		}
	case "redis-tair":
		srv := testserver.StartRedis(t, testserver.WithTairString(t))
		srv.AddNoScriptsUser(t)
		d.redis, d.noScriptsUser = []*testserver.Redis{srv}, true
		for _, addr := range d.clientAddrs(t, c, workers, srv.Addr()) {
			d.specs = append(d.specs, noScriptsSpec(addr))
		}
	case "redis-sentinel", "redis-sentinel-acks":
		var opts []testserver.SentinelOption
		if c.fault == "failover-lagging" {
			opts = append(opts, testserver.WithReplicationProxies())
		}
		d.sentinel = testserver.StartSentinel(t, opts...)
		if c.fault == "failover-lagging" {
			d.restoreSentinel = d.sentinel.KeepReplicationLinks()
		}
		spec := "sentinel:" + d.sentinel.Master() + "@" + strings.Join(d.sentinel.Addrs(), ",")
		if c.backend == "redis-sentinel-acks" {
			spec += "?acks=1"
		}
		for range workers {
			d.specs = append(d.specs, spec)
		}
	case "redis-clock":
		d.clocked = startShimmedRedis(t)
		for range workers {
			d.specs = append(d.specs, "redis:"+d.clocked.addr)
		}
	case "redlock":
		var addrs []string
		for i := range 3 {
			var addr string
			if c.fault == "kleppmann-clock" && i == 1 { // node B's clock will jump
				d.clocked = startShimmedRedis(t)
				addr = d.clocked.addr
			} else {
				srv := testserver.StartRedis(t)
				d.redis = append(d.redis, srv)
				addr = srv.Addr()
			}
			if c.fault == "partition-server" || strings.HasPrefix(c.fault, "kleppmann") { // one proxy per node, shared by the workers
				p := testserver.StartProxy(t, addr)
				d.proxies = append(d.proxies, p)
				addr = p.Addr()
			}
			addrs = append(addrs, addr)
		}
		for range workers {
			d.specs = append(d.specs, "redlock:"+strings.Join(addrs, ","))
		}
	case "etcd":
		d.etcd = etcdtest.StartProcess(t)
		for range workers {
			d.specs = append(d.specs, "etcd:"+d.etcd.ClientURL())
		}
	case "etcd3":
		d.etcd3 = etcdtest.Start(t, 3)
		for range workers {
			d.specs = append(d.specs, "etcd:"+strings.Join(d.etcd3.Endpoints(), ","))
		}
	case "zk":
		d.zk = testserver.StartZooKeeper(t)
		for _, addr := range d.clientAddrs(t, c, workers, d.zk.Addr()) {
			d.specs = append(d.specs, zkSpec([]string{addr}, c.ttl))
		}
	case "zk3":
		d.zk3 = testserver.StartZooKeeperEnsemble(t, 3)
		for range workers {
			d.specs = append(d.specs, zkSpec(testserver.ZooKeeperAddrs(d.zk3), c.ttl))
		}
	case "pg", "pgbouncer":
		// pgbouncer: the workers reach PostgreSQL through PgBouncer in
		// transaction pooling mode (its DSN turns pgx's statement cache
		// off, as PgBouncer needs).
		d.pg = testserver.StartPostgres(t)
		dsn, addr := d.pg.DSN(""), d.pg.Addr()
		if c.backend == "pgbouncer" {
			b := testserver.StartPgBouncer(t, d.pg)
			dsn, addr = b.DSN(""), b.Addr()
		}
		for _, a := range d.clientAddrs(t, c, workers, addr) {
			d.specs = append(d.specs, "pg:"+dsnAt(t, dsn, a))
		}
	case "file":
		d.fileDir = t.TempDir()
		for range workers {
			d.specs = append(d.specs, "file:"+d.fileDir)
		}
	default:
		t.Fatalf("unknown backend %q", c.backend)
	}
	return d
}

// noScriptsSpec is the backend spec of a Redis client of the server at
// addr that connects as testserver.NoScriptsUser, who may run every
// command but scripts.
func noScriptsSpec(addr string) string {
	return "redis:" + testserver.NoScriptsUser + ":" + testserver.NoScriptsPassword + "@" + addr
}

// restartRedis kills the deployment's one redis-server and starts it again
// (restart-volatile, restart-aof). The server's ACL users are part of its
// configuration, which a deployment keeps across a restart (an ACL file or
// redis.conf): the no-scripts user is created again as soon as the server
// answers; a connection made before that is refused (WRONGPASS), and its
// call fails as one sent during the restart does.
func (d *deployment) restartRedis(t *tb) {
	srv := d.redis[0]
	srv.Restart()
	if d.noScriptsUser {
		srv.AddNoScriptsUser(t)
	}
}

// clientAddrs is the address each of n workers reaches the server at addr
// by: through a fault proxy of its own (appended to d.proxies) when the
// fault acts on the client's link (partition-client, lost-replies), else
// addr itself.
func (d *deployment) clientAddrs(t *tb, c caseSpec, n int, addr string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = addr
		if c.fault == "partition-client" || c.fault == "lost-replies" {
			p := testserver.StartProxy(t, addr)
			d.proxies = append(d.proxies, p)
			out[i] = p.Addr()
		}
	}
	return out
}

// dsnAt is the connection URL dsn with its host:port replaced by addr
// (a worker's fault proxy).
func dsnAt(t *tb, dsn, addr string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// pauser is a server process the server-pause fault stops (SIGSTOP) and
// continues.
type pauser interface {
	Pause()
	Resume()
}

// pauseTargets are the servers the server-pause fault stops: the
// deployment's one server, a majority of Redlock's nodes, or a ZooKeeper
// ensemble's leader (none if no member reports itself leader within a TTL:
// an election is running, and the fault does not take place).
func (d *deployment) pauseTargets(c caseSpec) []pauser {
	switch {
	case d.etcd != nil:
		return []pauser{d.etcd}
	case d.zk != nil:
		return []pauser{d.zk}
	case d.pg != nil: // the postmaster and every backend
		return []pauser{d.pg}
	case d.zk3 != nil:
		// The leader: the followers elect another after syncLimit
		// ticks; the old one resumes to find itself deposed.
		if l := zkLeader(d.zk3, c.ttl); l != nil {
			return []pauser{l}
		}
		return nil
	}
	var out []pauser
	for _, s := range d.redis[:len(d.redis)/2+1] { // a majority (1 of 1)
		out = append(out, s)
	}
	return out
}

// zkSpec is the backend spec of a ZooKeeper client of servers whose locks
// last ttl: zklock derives a lock's lease from its session (two thirds of
// the session timeout, whatever WithTTL says), so the session timeout is
// ttl×3/2.
func zkSpec(addrs []string, ttl time.Duration) string {
	return "zk:" + strings.Join(addrs, ",") + "@" + (ttl * 3 / 2).String()
}

// zkLeader waits (bounded) until one member of the ensemble reports
// itself leader, and returns it (nil if none did: an election that is
// still running).
func zkLeader(nodes []*testserver.ZooKeeper, within time.Duration) *testserver.ZooKeeper {
	for end := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if l := testserver.ZooKeeperLeader(nodes); l != nil || time.Now().After(end) {
			return l
		}
	}
}

// proc is a running worker process.
type proc struct {
	id   int
	dir  string // the run directory (pause requests)
	cmd  *exec.Cmd
	done chan struct{}
	err  error       // cmd.Wait's, once done is closed
	kill atomic.Bool // the harness killed it on purpose (kill-holder)
}

func startWorker(t *tb, dir, spec string, id int, c caseSpec, dur time.Duration, seed uint64) *proc {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	mode, limit := c.workerMode(id)
	cmd := exec.Command(exe, "worker", "-id", strconv.Itoa(id), "-dir", dir, "-backend", spec,
		"-ttl", c.ttl.String(), "-think", c.think().String(), "-duration", dur.String(), "-seed", strconv.FormatUint(seed, 10),
		"-mode", mode, "-limit", strconv.Itoa(limit))
	errf, err := os.Create(filepath.Join(dir, fmt.Sprintf("worker-%d.stderr", id)))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	cmd.Stderr = errf
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{id: id, dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// stopped reports whether pid is stopped (state T in /proc/pid/stat).
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && (s[i+2] == 'T' || s[i+2] == 't')
}

// pauseInCriticalSection asks every worker of ws to stop itself at its
// next think step and waits (bounded) until one has; it returns the
// workers that stopped, none if none did within (none was getting the
// lock, or they exited). Asking them all lands the pause on whichever is
// in its section first: one chosen worker could wait behind the others
// for longer than within on a loaded machine, and a short run then had
// no pause at all. The requests not taken are withdrawn, so no worker
// stops later, unrecorded, with no one to resume it; a request taken
// just before its withdrawal is a pause that lands too (several
// workers may be in their sections at once: readers, permits), and it
// waits for that stop.
func pauseInCriticalSection(ws []*proc, within time.Duration) []*proc {
	var asked []*proc
	for _, w := range ws {
		if os.WriteFile(pauseRequest(w.dir, w.id), nil, 0o644) == nil {
			asked = append(asked, w)
		}
	}
	for end := time.Now().Add(within); time.Now().Before(end) && !anyStopped(asked); {
		time.Sleep(time.Millisecond)
	}
	var out []*proc
	for _, w := range asked {
		if err := os.Remove(pauseRequest(w.dir, w.id)); !errors.Is(err, os.ErrNotExist) {
			continue // withdrawn (or the file is gone some other way)
		}
		if waitStopped(w, 5*time.Second) { // taken: it is stopping now
			out = append(out, w)
		}
	}
	return out
}

// anyStopped reports whether a worker of ws is stopped.
func anyStopped(ws []*proc) bool {
	for _, w := range ws {
		if stopped(w.cmd.Process.Pid) {
			return true
		}
	}
	return false
}

// waitStopped waits until w is stopped (true), exits or within passes.
func waitStopped(w *proc, within time.Duration) bool {
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if stopped(w.cmd.Process.Pid) {
			return true
		}
		select {
		case <-w.done:
			return false
		default:
		}
	}
	return false
}

// caseResult is what one case produced.
type caseResult struct {
	spec       caseSpec
	events     []history.Event
	faultFrom  int64 // monotonic ns: the first fault began
	faultTo    int64 // the last fault ended
	start, end int64
	injected   int
	err        string
	skipped    string // why the case did not run (see unsupportedMode)
	seed       uint64
	analysis   *analyzed
}

// runCase deploys, runs the workers, injects the fault on a seeded
// schedule and collects the history.
func runCase(c caseSpec, workers int, seed uint64) (res caseResult) {
	res.spec, res.seed = c, seed
	t := &tb{}
	defer t.close()
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(fatal); ok {
				res.err = f.msg
				return
			}
			panic(r)
		}
	}()
	root, err := os.MkdirTemp("", "dlock-safety-")
	if err != nil {
		t.Fatal(err)
	}
	t.root = root
	t.Cleanup(func() { os.RemoveAll(root) })
	dir := t.TempDir()
	d := deploy(t, c, workers)
	if why := unsupportedMode(t, c, d.specs); why != "" {
		res.skipped = why
		return res
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	res.start = history.Now()
	var procs []*proc
	for i := range workers {
		procs = append(procs, startWorker(t, dir, d.specs[i], i, c, c.dur, seed))
	}
	end := time.Now().Add(c.dur)
	// The fault window is the middle of the run; the first third is the
	// baseline for availability.
	faultStart := time.Now().Add(c.dur / 3)
	hold, need := 3*c.ttl, 4*c.ttl
	if strings.HasPrefix(c.fault, "failover") {
		// It lasts as long as the sentinels take (a few seconds), then
		// the workers need a section or two to recover.
		hold, need = 0, 15*time.Second
	}
	time.Sleep(time.Until(faultStart))
	// Attempts are bounded by the run's time; one that did not take place
	// (a worker that did not reach its critical section in time) is
	// retried.
	for attempts := 0; res.injected < c.pauses && attempts < 4*c.pauses && time.Until(end) > need; attempts++ {
		// A random delay, so faults do not line up with the workers' loop.
		time.Sleep(time.Duration(rng.Int64N(int64(c.ttl / 2))))
		if inject(t, c, d, &procs, dir, seed, rng, hold, end, &res) {
			res.injected++
		}
		time.Sleep(c.ttl / 2) // recovery between faults
	}
	werr := waitWorkers(procs, end)
	res.end = history.Now()
	if werr != nil {
		t.Fatal(werr)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if res.events, err = history.ReadFiles(logs...); err != nil {
		t.Fatal(err)
	}
	return res
}

// waitWorkers waits for every worker to finish (bounded: 30 s past end,
// then it kills it). A worker that did not exit by then, or exited with an
// error the harness did not cause, is an error: the case's history would
// lack its work, silently.
func waitWorkers(procs []*proc, end time.Time) error {
	var errs []error
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(time.Until(end) + 30*time.Second):
			p.kill.Store(true)
			p.cmd.Process.Signal(syscall.SIGCONT)
			p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("worker %d still running 30 s after its end: killed", p.id))
			continue
		}
		if p.err != nil && !p.kill.Load() {
			errs = append(errs, fmt.Errorf("worker %d: %v: %s", p.id, p.err, stderrTail(p)))
		}
	}
	return errors.Join(errs...)
}

// stderrTail is the end of a worker's standard error.
func stderrTail(p *proc) string {
	b, _ := os.ReadFile(filepath.Join(p.dir, fmt.Sprintf("worker-%d.stderr", p.id)))
	if len(b) > 300 {
		b = b[len(b)-300:]
	}
	return strings.TrimSpace(string(b))
}

// inject applies one fault; it returns whether the fault took place.
func inject(t *tb, c caseSpec, d *deployment, procs *[]*proc, dir string, seed uint64, rng *rand.Rand, hold time.Duration, end time.Time, res *caseResult) bool {
	mark := func(from int64) {
		if res.faultFrom == 0 {
			res.faultFrom = from
		}
		res.faultTo = history.Now()
	}
	live := func() []*proc {
		var out []*proc
		for _, p := range *procs {
			select {
			case <-p.done:
			default:
				out = append(out, p)
			}
		}
		return out
	}
	switch c.fault {
	case "none":
		return false
	case "client-pause", "kill-holder":
		ws := live()
		if c.prim() == "rw" { // the writers are paused: readers only read
			ws = slices.DeleteFunc(ws, func(p *proc) bool { m, _ := c.workerMode(p.id); return m != "exclusive" })
		}
		if len(ws) == 0 {
			return false
		}
		paused := pauseInCriticalSection(ws, 2*c.ttl+time.Second)
		if len(paused) == 0 {
			return false
		}
		from := history.Now()
		if c.fault == "kill-holder" {
			// One holder dies; any other that stopped with it resumes.
			w := paused[0]
			for _, o := range paused[1:] {
				o.cmd.Process.Signal(syscall.SIGCONT)
			}
			w.kill.Store(true)
			w.cmd.Process.Kill()
			<-w.done
			mark(from)
			id := len(*procs)
			*procs = append(*procs, startWorker(t, dir, d.specs[w.id%len(d.specs)], id, c, time.Until(end), seed+uint64(id)))
			return true
		}
		time.Sleep(hold)
		for _, w := range paused {
			w.cmd.Process.Signal(syscall.SIGCONT)
		}
		mark(from)
		return true
	case "server-pause":
		servers := d.pauseTargets(c)
		if len(servers) == 0 {
			return false
		}
		from := history.Now()
		for _, s := range servers {
			s.Pause()
		}
		time.Sleep(hold)
		for _, s := range servers {
			s.Resume()
		}
		mark(from)
		return true
	case "partition-client", "partition-server":
		p := d.proxies[rng.IntN(len(d.proxies))]
		from := history.Now()
		p.Stall()
		time.Sleep(hold)
		p.Heal()
		mark(from)
		return true
	case "restart-volatile", "restart-aof", "restart":
		from := history.Now()
		if d.pg != nil {
			d.pg.Restart()
		} else {
			d.restartRedis(t)
		}
		mark(from)
		time.Sleep(c.ttl)
		return true
	case "clock-jump":
		from := history.Now()
		jumpClock(t, d.clocked, hold, nil)
		mark(from)
		return true
	case "kill-leader":
		if d.zk3 != nil {
			// Killed, then started again 3×TTL later (it rejoins as a
			// follower, with its data), so that a second kill finds a
			// full ensemble.
			l := zkLeader(d.zk3, c.ttl)
			if l == nil {
				return false
			}
			from := history.Now()
			l.Stop()
			time.Sleep(hold)
			l.Start()
			mark(from)
			return true
		}
		from := history.Now()
		d.etcd3.Leader().Stop()
		mark(from)
		return true
	case "kleppmann", "kleppmann-clock":
		// Node C is cut off for one TTL, so acquisitions meanwhile reach
		// A and B only; then B forgets the holder (a restart, or its
		// clock jumping past the lease) and C comes back.
		from := history.Now()
		c3 := d.proxies[2]
		c3.Cut()
		time.Sleep(c.ttl)
		if c.fault == "kleppmann" {
			d.redis[1].Restart()
			c3.Heal()
			time.Sleep(c.ttl)
		} else {
			jumpClock(t, d.clocked, hold, c3.Heal)
		}
		mark(from)
		return true
	case "lost-replies":
		from := history.Now()
		for stop := time.Now().Add(hold); time.Now().Before(stop); time.Sleep(c.ttl / 4) {
			d.proxies[rng.IntN(len(d.proxies))].LoseNextReply()
		}
		mark(from)
		return true
	case "failover", "failover-lagging":
		return injectFailover(t, c, d, mark)
	case "restart-minority":
		// Wait until some worker holds the lock, then make one node forget.
		from := history.Now()
		d.redis[rng.IntN(len(d.redis))].Restart()
		mark(from)
		time.Sleep(c.ttl)
		return true
	}
	t.Fatalf("unknown fault %q", c.fault)
	return false
}

// jumpClock moves srv's wall clock forward by d, calls then (if any), and
// moves it back to real time d later.
func jumpClock(t *tb, srv *shimmedRedis, d time.Duration, then func()) {
	if err := srv.offset.Set(d); err != nil {
		t.Fatal(err)
	}
	if then != nil {
		then()
	}
	time.Sleep(d)
	if err := srv.offset.Set(0); err != nil {
		t.Fatal(err)
	}
}

// injectFailover kills the Sentinel group's primary right after it granted
// the key to a worker (for failover, once the replicas have that grant;
// for failover-lagging, a grant taken after the replication links were
// stalled, so a replica that did not acknowledge it lacks it) and waits
// for the sentinels to promote a replica. It returns false if no worker
// was granted the key within 3 sections (the links are healed then).
func injectFailover(t *tb, c caseSpec, d *deployment, mark func(int64)) bool {
	s := d.sentinel
	old := s.Primary()
	var stalled []*testserver.Proxy
	from := history.Now()
	if c.fault == "failover-lagging" {
		stalled = s.ReplicationLinks
		if c.backend == "redis-sentinel-acks" {
			stalled = stalled[:1] // the other replica acknowledges
		}
		for _, p := range stalled {
			p.Stall()
		}
		// The lease held when the links stalled is the last the stalled
		// replicas saw: let it expire (a TTL after its last renewal), so
		// that a promoted replica holds no lease at all rather than that
		// stale one, which would keep everyone out until its expiry.
		time.Sleep(c.ttl)
	}
	heal := func() {
		for _, p := range stalled {
			p.Heal()
		}
	}
	if !waitGrant(old, sentinelLockKey, 3*c.think()) {
		heal()
		return false
	}
	if c.fault == "failover" {
		s.WaitSynced(old)
		from = history.Now()
	}
	old.Stop()
	if d.restoreSentinel != nil {
		d.restoreSentinel()
	}
	s.WaitFailover(old)
	// The sentinels point the replicas at the new primary directly; the
	// stalled proxied connections are of no use to anyone now.
	heal()
	mark(from)
	return true
}

// sentinelLockKey is the Redis key of the workers' lock (the worker's
// default -key, under redislock's default prefix).
var sentinelLockKey = func() string {
	c := redis.NewClient(&redis.Options{}) // never dials: LockKey only names
	defer c.Close()
	return redislock.New(c).LockKey("safety/register")
}()

// waitGrant polls srv (bounded by within) until its lock key holds an
// exclusive lease other than the one it held when the wait began: a grant
// just made. It returns false if none came.
func waitGrant(srv *testserver.Redis, key string, within time.Duration) bool {
	owner := func(v string) string {
		o, _, _ := strings.Cut(v, "|")
		return o
	}
	v0, _ := srv.Do("GET", key)
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		v, err := srv.Do("GET", key)
		if err != nil {
			continue
		}
		if o := owner(v); o != "" && !strings.HasPrefix(o, "*") && o != owner(v0) {
			return true
		}
	}
	return false
}
