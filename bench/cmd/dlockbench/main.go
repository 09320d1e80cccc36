// Command dlockbench measures dlock against the raw-Redis floor and peer
// libraries (Redis, etcd, ZooKeeper, PostgreSQL) in one run, on servers it starts
// itself on loopback, prints the results with ratios and checks them
// against the project's targets. With -out it also writes the report as
// Markdown (docs/benchmarks.md).
//
//	go run ./cmd/dlockbench -out ../docs/benchmarks.md
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/etcdlock/etcdtest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// tb lets the test-server helpers run outside `go test`.
type tb struct {
	cleanups []func()
}

func (t *tb) Helper()                      {}
func (t *tb) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (t *tb) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (t *tb) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, "dlockbench: "+f+"\n", args...) }
func (t *tb) Skip(args ...any)             { panic(fmt.Sprint(args...)) }
func (t *tb) Cleanup(f func())             { t.cleanups = append(t.cleanups, f) }
func (t *tb) TempDir() string {
	d, _ := os.MkdirTemp("", "dlockbench-")
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (t *tb) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

type config struct {
	measure    time.Duration // per library, scenarios 2 and 3
	contend    time.Duration // scenario 4
	contenders int
	parallel   int
	heldN      int
	heldD      time.Duration
	heldTTL    time.Duration
	// heldManyN locks with TTL heldManyTTL: the scale row.
	heldManyN   int
	heldManyTTL time.Duration
	out         string
	group       string // only this group's libraries (a development run)
}

func main() {
	redis.SetLogger(quietRedis{})
	var cfg config
	flag.DurationVar(&cfg.measure, "d", 3*time.Second, "measuring time per library for latency and throughput")
	flag.DurationVar(&cfg.contend, "contend", 5*time.Second, "contention time per library")
	flag.IntVar(&cfg.contenders, "contenders", 16, "contenders on one key")
	flag.IntVar(&cfg.parallel, "parallel", 32, "goroutines in the throughput scenario")
	flag.IntVar(&cfg.heldN, "held", 10000, "locks held in the many-locks scenario")
	flag.DurationVar(&cfg.heldD, "held-d", 30*time.Second, "how long the many locks are held")
	flag.DurationVar(&cfg.heldTTL, "held-ttl", 3*time.Second, "TTL of the many held locks (renewed every TTL/3)")
	flag.IntVar(&cfg.heldManyN, "held-many", 100000, "locks held in the scale row of the many-locks scenario")
	flag.DurationVar(&cfg.heldManyTTL, "held-many-ttl", 30*time.Second, "TTL of the scale row's locks")
	flag.StringVar(&cfg.out, "out", "", "write the Markdown report to this file")
	flag.StringVar(&cfg.group, "group", "", "measure only this group's libraries (redis, redis-ha, tair, redlock, etcd, zookeeper, postgres): a development run, without the held-locks scenario or -out (targets of other groups read as not met)")
	quick := flag.Bool("quick", false, "short run (1s per library, 2s contention, 2000 locks for 5s) for smoke tests")
	flag.Parse()
	if *quick {
		cfg.measure, cfg.contend, cfg.heldN, cfg.heldManyN, cfg.heldManyTTL, cfg.heldD = time.Second, 2*time.Second, 2000, 5000, 3*time.Second, 5*time.Second
	}
	if cfg.group != "" && cfg.out != "" {
		fmt.Fprintln(os.Stderr, "dlockbench: -group is a development run: it writes no report (-out)")
		os.Exit(2)
	}
	t := &tb{}
	code := 0
	func() {
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintln(os.Stderr, "dlockbench:", r)
				code = 1
			}
		}()
		code = run(t, cfg)
	}()
	t.close()
	os.Exit(code)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(t *tb, cfg config) int {
	started := time.Now()
	progress("starting 5 redis-servers, a redis-server with the TairString module, a Sentinel group (primary, replica, sentinel), 1 etcd member, 1 ZooKeeper server and 1 PostgreSQL server on loopback")
	e := &env{}
	for i := 0; i < 5; i++ {
		e.redis = append(e.redis, testserver.StartRedis(t).Addr())
	}
	tair, tairErr := startTair(t)
	if tairErr != nil {
		progress("no tair group: %v", tairErr)
	}
	e.tair = tair
	sg := testserver.StartSentinel(t, testserver.WithReplicas(1), testserver.WithSentinels(1))
	e.sentinelMaster, e.sentinels = sg.Master(), sg.Addrs()
	e.etcdEPs = etcdtest.Start(t, 1).Endpoints()
	zks := testserver.StartZooKeeper(t)
	e.zk = []string{zks.Addr()}
	pg := testserver.StartPostgres(t)
	e.pg = pg.DSN("")
	libs := libraries(e)
	if cfg.group != "" {
		var only []lib
		for _, l := range libs {
			if l.group == cfg.group {
				only = append(only, l)
			}
		}
		if len(only) == 0 {
			if cfg.group == "tair" && tairErr != nil {
				fmt.Fprintln(os.Stderr, "dlockbench: no tair group:", tairErr)
				return 1
			}
			fmt.Fprintf(os.Stderr, "dlockbench: no library in group %q\n", cfg.group)
			return 2
		}
		libs = only
	}
	rep := &report{cfg: cfg, libs: libs, zkVersion: zkVersion(zks), pgVersion: pgVersion(pg), unc: map[string]uncontendedResult{}, thr: map[string]float64{}, con: map[string]contendedResult{}, errs: map[string]string{}}
	if tairErr != nil && cfg.group == "" {
		rep.errs["tair"] = "group not measured: " + tairErr.Error()
	}

	if cfg.group == "" {
		// First, in a process that has done nothing else yet: the heap
		// per lock is a difference of two heap readings, which another
		// scenario's leftovers (freed meanwhile) would understate.
		for _, run := range []struct {
			n   int
			ttl time.Duration
		}{{cfg.heldN, cfg.heldTTL}, {cfg.heldManyN, cfg.heldManyTTL}} {
			progress("many held    dlock redislock (%d locks, ttl %v, %v)", run.n, run.ttl, cfg.heldD)
			h, err := manyHeld(e.redis[0], run.n, run.ttl, cfg.heldD)
			if err != nil {
				rep.errs[fmt.Sprintf("%d held", run.n)] = err.Error()
				continue
			}
			rep.held = append(rep.held, h)
		}
	}
	progress("uncontended  all %d libraries, interleaved in 10 rounds (%v each)", len(libs), cfg.measure)
	rep.unc = uncontendedAll(libs, cfg.measure, 10)
	for name, r := range rep.unc {
		if r.err != nil {
			rep.errs[name+"/uncontended"] = r.err.Error()
		}
	}
	for _, l := range libs {
		progress("throughput   %-26s (%d goroutines, %v)", l.name, cfg.parallel, cfg.measure)
		ops, err := throughput(l, cfg.parallel, cfg.measure)
		if err != nil {
			rep.errs[l.name+"/throughput"] = err.Error()
		}
		rep.thr[l.name] = ops
	}
	for _, l := range libs {
		if !l.contended {
			continue
		}
		progress("contended    %-26s (%d contenders, %v)", l.name, cfg.contenders, cfg.contend)
		r, err := contended(l, cfg.contenders, cfg.contend)
		if err != nil {
			rep.errs[l.name+"/contended"] = err.Error()
		}
		rep.con[l.name] = r
	}
	groups := map[string]bool{}
	for _, l := range libs {
		groups[l.group] = true
	}
	rep.modes = modesAll(e, groups, cfg.contenders, cfg.contend)
	for _, m := range rep.modes {
		for i, msg := range m.errs {
			rep.errs[fmt.Sprintf("%s/modes/%d", m.lib.name, i)] = msg
		}
	}
	if cfg.group != "" {
		fmt.Println(rep.markdown())
		return 0
	}
	rep.elapsed = time.Since(started)
	md := rep.markdown()
	fmt.Println(md)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "dlockbench:", err)
			return 1
		}
		progress("wrote %s", cfg.out)
	}
	return 0
}

// startTair starts the tair group's server: a redis-server with the
// TairString module loaded and the ACL user testserver.NoScriptsUser, who
// may run every command but the scripting ones. It returns the server's
// address, or why it could not start (the module is not available where
// it is neither built nor buildable).
func startTair(t *tb) (addr string, err error) {
	defer func() {
		if r := recover(); r != nil {
			addr, err = "", fmt.Errorf("%v", r)
		}
	}()
	srv := testserver.StartRedis(t, testserver.WithTairString(t))
	srv.AddNoScriptsUser(t)
	return srv.Addr(), nil
}

// zkVersion is the server's version as "srvr" reports it.
func zkVersion(z *testserver.ZooKeeper) string {
	out, err := z.FourLetter("srvr")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			v, _, _ = strings.Cut(v, ",")  // drop ", built on ..."
			v, _, _ = strings.Cut(v, "-$") // Debian's jar: "3.8.0-${mvngit.commit.id}"
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// pgVersion is the server's version as it reports it ("15.14"), without
// the packager's note in parentheses.
func pgVersion(p *testserver.Postgres) string {
	v, err := p.Exec("", "SHOW server_version")
	if err != nil || v == "" {
		return "?"
	}
	v, _, _ = strings.Cut(v, " (") // Debian's "15.14 (Debian 15.14-0+deb12u1)"
	return v
}

// machine describes where the numbers come from.
func machine(zkV, pgV string) string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	redisV := "redis-server ?"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		redisV = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s, %d cores (GOMAXPROCS %d), %s %s/%s; %s; etcd (embedded) %s; ZooKeeper %s (standalone); PostgreSQL %s (fsync off)",
		cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, redisV, etcdVersion(), zkV, pgV)
}
