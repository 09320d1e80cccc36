package testserver

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// SentinelMaster is the master name StartSentinel's sentinels monitor.
const SentinelMaster = "dlockmaster"

// Sentinel is a Redis replication group watched by redis-sentinel
// processes, all owned by a test: Servers[0] starts as the primary, the
// others as its replicas, and the sentinels fail over to a replica when
// the primary stops answering (killed or paused) for DownAfter.
type Sentinel struct {
	t TB
	// Servers are the redis-servers; Servers[0] was the first primary.
	Servers []*Redis
	// Sentinels are the redis-sentinel processes.
	Sentinels []*Redis
	// ReplicationLinks are, with WithReplicationProxies, the fault proxies
	// Servers[i+1] replicates Servers[0] through (stall one, and that
	// replica misses the primary's writes while staying up and eligible
	// for promotion); nil otherwise.
	ReplicationLinks []*Proxy
	// DownAfter is how long a primary must not answer before the
	// sentinels consider it down (down-after-milliseconds).
	DownAfter time.Duration
	cfg       sentinelConfig
}

type sentinelConfig struct {
	replicas, sentinels int
	downAfter           time.Duration
	password            string // the data servers'
	sentinelPassword    string // the sentinels'
	proxied             bool
}

// SentinelOption configures StartSentinel.
type SentinelOption func(*sentinelConfig)

// WithReplicas sets the number of replicas (default 2; 0 or more).
func WithReplicas(n int) SentinelOption { return func(c *sentinelConfig) { c.replicas = n } }

// WithSentinels sets the number of sentinels (default 3, at least 1; the
// quorum is a majority of them).
func WithSentinels(n int) SentinelOption { return func(c *sentinelConfig) { c.sentinels = n } }

// WithDownAfter sets down-after-milliseconds (default 1s, at least 1ms).
func WithDownAfter(d time.Duration) SentinelOption {
	return func(c *sentinelConfig) { c.downAfter = d }
}

// WithReplicationProxies makes each replica replicate the first primary
// through a fault proxy of its own (Sentinel.ReplicationLinks). After a
// failover the sentinels point the replicas at the new primary directly.
func WithReplicationProxies() SentinelOption {
	return func(c *sentinelConfig) { c.proxied = true }
}

// WithDataPassword makes the data servers require a password (and the
// replicas and sentinels use it).
func WithDataPassword(pw string) SentinelOption {
	return func(c *sentinelConfig) { c.password = pw }
}

// WithSentinelPassword makes the sentinels require a password.
func WithSentinelPassword(pw string) SentinelOption {
	return func(c *sentinelConfig) { c.sentinelPassword = pw }
}

// StartSentinel starts a primary, its replicas (in sync) and the sentinels
// watching them on free loopback ports, waits until every sentinel knows
// every replica and every other sentinel, and registers their shutdown
// with t.Cleanup.
func StartSentinel(t TB, opts ...SentinelOption) *Sentinel {
	t.Helper()
	cfg := sentinelConfig{replicas: 2, sentinels: 3, downAfter: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	// Refused before anything starts: a group that cannot form would
	// otherwise be waited for (twice startTimeout), and one without
	// sentinels would never report a primary.
	switch {
	case cfg.replicas < 0:
		t.Fatalf("StartSentinel: WithReplicas(%d): want 0 or more", cfg.replicas)
	case cfg.sentinels < 1:
		t.Fatalf("StartSentinel: WithSentinels(%d): want 1 or more", cfg.sentinels)
	case cfg.downAfter < time.Millisecond:
		t.Fatalf("StartSentinel: WithDownAfter(%v): want 1ms or more (redis-sentinel counts milliseconds, and refuses 0)", cfg.downAfter)
	}
	sbin := Binary(t, "redis-sentinel")
	s := &Sentinel{t: t, DownAfter: cfg.downAfter, cfg: cfg}
	var dataOpts []RedisOption
	if cfg.password != "" {
		dataOpts = append(dataOpts, WithPassword(cfg.password), WithArgs("--masterauth", cfg.password))
	}
	// Diskless full syncs without the default 5s delay: replicas are in
	// sync within moments of starting (and after a failover).
	dataOpts = append(dataOpts, WithArgs("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"))
	primary := StartRedis(t, dataOpts...)
	s.Servers = append(s.Servers, primary)
	for i := 0; i < cfg.replicas; i++ {
		port := primary.Port()
		if cfg.proxied {
			p := StartProxy(t, primary.Addr())
			s.ReplicationLinks = append(s.ReplicationLinks, p)
			_, ps, _ := net.SplitHostPort(p.Addr())
			port, _ = strconv.Atoi(ps)
		}
		r := StartRedis(t, append(dataOpts[:len(dataOpts):len(dataOpts)],
			WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(port)))...)
		s.Servers = append(s.Servers, r)
	}
	s.WaitSynced(primary)
	quorum := cfg.sentinels/2 + 1
	for i := 0; i < cfg.sentinels; i++ {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		var b strings.Builder
		fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d %d\n", SentinelMaster, primary.Port(), quorum)
		fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", SentinelMaster, cfg.downAfter.Milliseconds())
		fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", SentinelMaster, max(3*cfg.downAfter, 3*time.Second).Milliseconds())
		fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", SentinelMaster)
		if cfg.password != "" {
			fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", SentinelMaster, cfg.password)
		}
		if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
			t.Fatalf("sentinel config: %v", err)
		}
		r := &Redis{t: t, bin: sbin, dir: dir, conf: conf, password: cfg.sentinelPassword}
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			r.port = FreePort(t)
			if err = r.start(); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("redis-sentinel did not start: %v", err)
		}
		t.Cleanup(r.Stop)
		s.Sentinels = append(s.Sentinels, r)
	}
	s.waitSentinels()
	return s
}

// Master is the master name the sentinels monitor.
func (s *Sentinel) Master() string { return SentinelMaster }

// Addrs are the sentinels' host:port addresses.
func (s *Sentinel) Addrs() []string {
	a := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		a[i] = r.Addr()
	}
	return a
}

// waitSentinels waits until every sentinel sees the master as ok, with
// all its replicas and all the other sentinels.
func (s *Sentinel) waitSentinels() {
	s.t.Helper()
	want := fmt.Sprintf("slaves=%d,sentinels=%d", s.cfg.replicas, s.cfg.sentinels)
	deadline := time.Now().Add(2 * startTimeout)
	for _, sn := range s.Sentinels {
		for {
			info, err := sn.Do("INFO", "sentinel")
			if err == nil && strings.Contains(info, "status=ok") && strings.Contains(info, want) {
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("sentinel %s did not see the group (%s) within %v: %q %v", sn.Addr(), want, 2*startTimeout, info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// server is the data server listening on addr, or nil.
func (s *Sentinel) server(addr string) *Redis {
	for _, r := range s.Servers {
		if r.Addr() == addr {
			return r
		}
	}
	return nil
}

// PrimaryAddr is the primary's address as the first sentinel that answers
// reports it ("" when none answers).
func (s *Sentinel) PrimaryAddr() string {
	for _, sn := range s.Sentinels {
		if sn.paused || sn.cmd == nil {
			continue
		}
		reply, err := sn.Do("SENTINEL", "get-master-addr-by-name", SentinelMaster)
		if err != nil {
			continue
		}
		hp := strings.Split(reply, "\n")
		if len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1])
		}
	}
	return ""
}

// Primary is the data server the sentinels report as the primary.
func (s *Sentinel) Primary() *Redis {
	s.t.Helper()
	addr := s.PrimaryAddr()
	r := s.server(addr)
	if r == nil {
		s.t.Fatalf("sentinels report primary %q, not one of the group's servers", addr)
	}
	return r
}

// Replicas are the data servers other than the one the sentinels report
// as the primary.
func (s *Sentinel) Replicas() []*Redis {
	p := s.Primary()
	var rs []*Redis
	for _, r := range s.Servers {
		if r != p {
			rs = append(rs, r)
		}
	}
	return rs
}

// WaitFailover waits (at most a minute) until every running sentinel
// reports a primary other than old and that server has taken the primary
// role, and returns it.
func (s *Sentinel) WaitFailover(old *Redis) *Redis {
	s.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if p := s.agreed(); p != nil && p != old {
			if info, err := p.Do("INFO", "replication"); err == nil && strings.Contains(info, "role:master") {
				return p
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no failover from %s within a minute (sentinels report %q)", old.Addr(), s.PrimaryAddr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// agreed is the primary every running sentinel reports, or nil.
func (s *Sentinel) agreed() *Redis {
	var p *Redis
	for _, sn := range s.Sentinels {
		if sn.paused || sn.cmd == nil {
			continue
		}
		reply, err := sn.Do("SENTINEL", "get-master-addr-by-name", SentinelMaster)
		hp := strings.Split(reply, "\n")
		if err != nil || len(hp) != 2 {
			return nil
		}
		r := s.server(net.JoinHostPort(hp[0], hp[1]))
		if r == nil || (p != nil && r != p) {
			return nil
		}
		p = r
	}
	return p
}

// WaitSynced waits (at most startTimeout) until every other running,
// unpaused server is an online replica of primary that acknowledged its
// replication stream up to primary's offset when the wait began: they
// have every write made before. (Equal offsets may never be seen under
// steady writes, and the REPLCONF GETACKs that WAIT sends.)
func (s *Sentinel) WaitSynced(primary *Redis) {
	s.t.Helper()
	want := 0
	for _, r := range s.Servers {
		if r != primary && r.cmd != nil && !r.paused {
			want++
		}
	}
	info, err := primary.Do("INFO", "replication")
	off, ok := infoField(info, "master_repl_offset")
	if err != nil || !ok {
		s.t.Fatalf("INFO replication of %s: %q %v", primary.Addr(), info, err)
	}
	target, _ := strconv.ParseInt(off, 10, 64)
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := primary.Do("INFO", "replication")
		if err == nil && replicasAt(info, target) >= want {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%d replicas of %s not at offset %d within %v: %q %v", want, primary.Addr(), target, startTimeout, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// infoField is the value of field in an INFO reply.
func infoField(info, field string) (string, bool) {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v, true
		}
	}
	return "", false
}

// replicasAt counts the online replicas of an INFO replication reply at
// offset target or past it.
func replicasAt(info string, target int64) int {
	n := 0
	for _, l := range strings.Split(info, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "slave") || !strings.Contains(l, "state=online") {
			continue
		}
		for _, kv := range strings.Split(l, ",") {
			if v, ok := strings.CutPrefix(kv, "offset="); ok {
				if o, err := strconv.ParseInt(v, 10, 64); err == nil && o >= target {
					n++
				}
			}
		}
	}
	return n
}

// KeepReplicationLinks keeps the replicas of a group started with
// WithReplicationProxies on their replication proxies until restore is
// called. A sentinel "fixes" a replica whose master address is not the
// primary's (a proxy's is not) with REPLICAOF the primary, once
// failover-timeout has passed since it found the replica (about 10 s
// after the start here): a stalled link would then be bypassed and the
// replica have every write. So failover-timeout is raised on every
// sentinel meanwhile; restore sets it back. Call restore once the
// primary is gone: the fix can then only point a replica at the dead
// primary, and a failover needing a second election is not held back by
// the raised timeout.
func (s *Sentinel) KeepReplicationLinks() (restore func()) {
	s.t.Helper()
	set := func(v string) error {
		for _, sn := range s.Sentinels {
			if _, err := sn.Do("SENTINEL", "SET", SentinelMaster, "failover-timeout", v); err != nil {
				return err
			}
		}
		return nil
	}
	reply, err := s.Sentinels[0].Do("SENTINEL", "MASTER", SentinelMaster)
	if err != nil {
		s.t.Fatalf("SENTINEL MASTER: %v", err)
	}
	fields := strings.Split(reply, "\n")
	orig := ""
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "failover-timeout" {
			orig = fields[i+1]
		}
	}
	if orig == "" {
		s.t.Fatalf("SENTINEL MASTER %s has no failover-timeout: %q", SentinelMaster, reply)
	}
	if err := set(strconv.Itoa(int(time.Hour.Milliseconds()))); err != nil {
		s.t.Fatalf("raising failover-timeout: %v", err)
	}
	return func() {
		if err := set(orig); err != nil {
			s.t.Errorf("restoring failover-timeout %s: %v", orig, err)
		}
	}
}
