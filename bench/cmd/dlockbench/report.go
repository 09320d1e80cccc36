package main

import (
	"fmt"
	"strings"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

func etcdVersion() string { return etcdversion.Version }

type report struct {
	cfg       config
	zkVersion string
	pgVersion string
	libs      []lib
	unc       map[string]uncontendedResult
	thr       map[string]float64
	con       map[string]contendedResult
	held      []heldResult
	modes     []modeResults
	errs      map[string]string
	elapsed   time.Duration
}

const (
	nFloor  = "floor: SET NX PX + CAD"
	nDRedis = "dlock redislock"
	// The redis-ha group: the cost of replica acknowledgement.
	nDSentinel = "dlock redislock (Sentinel)"
	nDAcks     = "dlock redislock (Sentinel, acks=1)"
	// The tair group: redislock without scripts, on TairString.
	nTairFloor = "floor: SET NX PX + CAD (Tair)"
	nDTair     = "dlock redislock (Tair, no scripts)"
	// The same server as a user who may run scripts: the A/B of the two
	// protocols.
	nDTairScripts = "dlock redislock (Tair server, scripts)"
	nBsm          = "bsm/redislock"
	nRS1          = "redsync (1 pool)"
	nRueidis      = "rueidislock"
	nDRL          = "dlock redlock (5 nodes)"
	nRS5          = "redsync (5 pools)"
	nDEtcd        = "dlock etcdlock"
	nMutex        = "etcd concurrency.Mutex"
	nDZk          = "dlock zklock"
	nGoZk         = "go-zookeeper zk.Lock"
	nDPg          = "dlock pglock"
)

func us(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	if d >= 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/1e3)
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

type target struct {
	what     string
	met      bool
	measured string
}

func (r *report) targets() []target {
	var ts []target
	add := func(what string, ok bool, f string, args ...any) {
		ts = append(ts, target{what, ok, fmt.Sprintf(f, args...)})
	}
	p50 := func(n string) float64 { return float64(r.unc[n].p50) }
	hps := func(n string) float64 { return r.con[n].handoffsPerS }

	fl, d := p50(nFloor), p50(nDRedis)
	add("redislock uncontended p50 ≤ 1.15× the floor", d > 0 && d <= 1.15*fl, "%s (%s vs %s)", ratio(d, fl), us(r.unc[nDRedis].p50), us(r.unc[nFloor].p50))
	for _, peer := range []string{nBsm, nRS1, nRueidis} {
		add("redislock uncontended p50 ≤ "+peer, d > 0 && d <= p50(peer), "%s of %s", ratio(d, p50(peer)), us(r.unc[peer].p50))
	}
	dh := hps(nDRedis)
	add("contended handoffs/s ≥ 20× redsync (1 pool, defaults)", dh >= 20*hps(nRS1), "%s (%.0f vs %.1f /s)", ratio(dh, hps(nRS1)), dh, hps(nRS1))
	add("contended handoffs/s ≥ 3× bsm/redislock (10ms retry)", dh >= 3*hps(nBsm), "%s (%.0f vs %.0f /s)", ratio(dh, hps(nBsm)), dh, hps(nBsm))
	add("contended handoffs/s ≥ rueidislock", dh >= hps(nRueidis), "%s (%.0f vs %.0f /s)", ratio(dh, hps(nRueidis)), dh, hps(nRueidis))
	rtt := r.unc[nFloor].p50 / 2 // the floor is two round trips
	hp50 := r.con[nDRedis].handoffP50
	add("redislock handoff p50 within 3 round trips", hp50 > 0 && hp50 <= 3*rtt, "%s = %.1f round trips of %s", us(hp50), float64(hp50)/float64(rtt), us(rtt))
	c := r.con[nDRedis]
	add("redislock longest wait ≤ 10× mean wait", c.meanWait > 0 && c.maxWait <= 10*c.meanWait, "%s / %s = %s", us(c.maxWait), us(c.meanWait), ratio(float64(c.maxWait), float64(c.meanWait)))
	rl, rs5 := p50(nDRL), p50(nRS5)
	add("redlock 5-node p50 ≤ 0.8× redsync 5-pool p50", rl > 0 && rl <= 0.8*rs5, "%s (%s vs %s)", ratio(rl, rs5), us(r.unc[nDRL].p50), us(r.unc[nRS5].p50))
	add("redlock 5-node throughput ≥ redsync 5-pool", r.thr[nDRL] >= r.thr[nRS5] && r.thr[nDRL] > 0, "%s (%.0f vs %.0f ops/s)", ratio(r.thr[nDRL], r.thr[nRS5]), r.thr[nDRL], r.thr[nRS5])
	de, mu := p50(nDEtcd), p50(nMutex)
	add("etcdlock uncontended p50 ≤ 1.1× concurrency.Mutex", de > 0 && de <= 1.1*mu, "%s (%s vs %s)", ratio(de, mu), us(r.unc[nDEtcd].p50), us(r.unc[nMutex].p50))
	add("etcdlock contended handoffs/s ≥ 2× concurrency.Mutex", hps(nDEtcd) >= 2*hps(nMutex) && hps(nDEtcd) > 0, "%s (%.0f vs %.0f /s)", ratio(hps(nDEtcd), hps(nMutex)), hps(nDEtcd), hps(nMutex))
	if r.hasGroup("zookeeper") {
		dz, gz := p50(nDZk), p50(nGoZk)
		add("zklock uncontended p50 ≤ 1.1× go-zookeeper's zk.Lock", dz > 0 && dz <= 1.1*gz, "%s (%s vs %s)", ratio(dz, gz), us(r.unc[nDZk].p50), us(r.unc[nGoZk].p50))
		add("zklock contended handoffs/s ≥ 1.5× go-zookeeper's zk.Lock", hps(nDZk) >= 1.5*hps(nGoZk) && hps(nDZk) > 0, "%s (%.0f vs %.0f /s)", ratio(hps(nDZk), hps(nGoZk)), hps(nDZk), hps(nGoZk))
	}
	for _, m := range r.modes {
		if m.lib.name != nDRedis || m.read.unsupported {
			continue
		}
		ex := hps(m.lib.exclusive)
		add(fmt.Sprintf("redislock read lock: acquisitions/s with %d readers ≥ 10× exclusive handoffs/s with %d contenders", m.read.contenders, r.cfg.contenders),
			m.read.perS > 0 && ex > 0 && m.read.perS >= 10*ex, "%s (%.0f vs %.0f /s)", ratio(m.read.perS, ex), m.read.perS, ex)
		if !m.sem.unsupported {
			add(fmt.Sprintf("redislock semaphore (limit %d): never more than %d holders inside", semLimit, semLimit),
				m.sem.acquisitions > 0 && m.sem.overLimit == 0, "%d entries beyond the limit in %d acquisitions", m.sem.overLimit, m.sem.acquisitions)
		}
	}
	for _, h := range r.held {
		perTick := float64(h.roundTrips) / h.ticks
		cpu := 100 * h.cpu.Seconds() / h.duration.Seconds()
		add(fmt.Sprintf("%d held locks: renewal round trips per tick ≤ connections", h.locks), h.roundTrips > 0 && perTick <= 64, "%.1f round trips per tick (%d in %.0f ticks; pool of 64 connections)", perTick, h.roundTrips, h.ticks)
		add(fmt.Sprintf("%d held locks: ≤ 1 KiB of heap per held lock", h.locks), h.bytesPerLock > 0 && h.bytesPerLock <= 1024, "%.0f bytes per lock", h.bytesPerLock)
		add(fmt.Sprintf("%d held locks: no lock lost", h.locks), h.lost == 0, "%d lost", h.lost)
		if h.locks >= 100000 {
			add(fmt.Sprintf("%d held locks (TTL %v): < 5%% of one core", h.locks, h.ttl), cpu < 5, "%.1f%% (%s in %v, the Redis server's CPU not counted)", cpu, h.cpu.Round(time.Millisecond), h.duration)
		}
	}
	return ts
}

// floorOf names the floor the rows of group are compared with: the tair
// group's own, on its server, else the Redis floor.
func floorOf(group string) string {
	if group == "tair" {
		return nTairFloor
	}
	return nFloor
}

// hasGroup reports whether a library of group is in the run.
func (r *report) hasGroup(group string) bool {
	for _, l := range r.libs {
		if l.group == group {
			return true
		}
	}
	return false
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(f string, args ...any) { fmt.Fprintf(&b, f, args...) }
	w("# Benchmarks\n\n")
	w("Generated by `make bench` (`cd bench && go run ./cmd/dlockbench -out ../docs/benchmarks.md`) on %s, in %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second))
	w("Machine: %s. Every server runs on this machine (loopback), so round trips are cheap and CPU is shared between clients and servers: on 2 cores, absolute numbers are small and noisy; compare the ratios.\n\n", machine(r.zkVersion, r.pgVersion))
	w("Settings: %v per library for latency and throughput, %d goroutines for throughput, %d contenders for %v on one key, %d and %d held locks for %v. Leases: %v where a library takes one.\n\n", r.cfg.measure, r.cfg.parallel, r.cfg.contenders, r.cfg.contend, r.cfg.heldN, r.cfg.heldManyN, r.cfg.heldD, benchTTL)

	w("## Targets\n\n| target | result | measured |\n|---|---|---|\n")
	met := 0
	ts := r.targets()
	for _, t := range ts {
		v := "**not met**"
		if t.met {
			v, met = "met", met+1
		}
		w("| %s | %s | %s |\n", t.what, v, t.measured)
	}
	w("\n%d of %d targets met.\n\n", met, len(ts))

	w("## Uncontended acquire + release (1 goroutine, distinct keys)\n\nThe libraries are measured interleaved, in 10 rounds, so that changes in the machine's speed during the run hit all of them alike.\n\n")
	w("| library | p50 | p99 | ops/s | p50 vs floor | p50 vs dlock of its group |\n|---|---|---|---|---|---|\n")
	dl := map[string]string{"redis-ha": nDSentinel, "redis": nDRedis, "tair": nDTair, "redlock": nDRL, "etcd": nDEtcd, "zookeeper": nDZk, "postgres": nDPg}
	for _, l := range r.libs {
		u := r.unc[l.name]
		w("| %s | %s | %s | %.0f | %s | %s |\n", l.name, us(u.p50), us(u.p99), u.opsPerS, ratio(float64(u.p50), float64(r.unc[floorOf(l.group)].p50)), ratio(float64(u.p50), float64(r.unc[dl[l.group]].p50)))
	}
	w("\n## Throughput (%d goroutines sharing one client, distinct keys)\n\n| library | ops/s | vs dlock of its group |\n|---|---|---|\n", r.cfg.parallel)
	for _, l := range r.libs {
		w("| %s | %.0f | %s |\n", l.name, r.thr[l.name], ratio(r.thr[l.name], r.thr[dl[l.group]]))
	}
	w("\n## Contended: %d contenders on one key, each with its own connections, for %v\n\n", r.cfg.contenders, r.cfg.contend)
	w("A handoff is an acquisition by a contender other than the previous holder; its latency runs from the previous holder's release call to the new holder's return from acquire. Lost updates counts increments of a shared counter (read, then write, under the lock) that went missing; it must be 0.\n\n")
	w("| library | mode (defaults) | handoffs/s | handoff p50 | handoff p99 | mean wait | longest wait | longest/mean | acquisitions | gave up | lost updates |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range r.libs {
		if !l.contended {
			continue
		}
		c := r.con[l.name]
		w("| %s | %s | %.0f | %s | %s | %s | %s | %s | %d | %d | %d |\n", l.name, l.mode, c.handoffsPerS, us(c.handoffP50), us(c.handoffP99), us(c.meanWait), us(c.maxWait), ratio(float64(c.maxWait), float64(c.meanWait)), c.acquisitions, c.failures, c.lostUpdates)
	}
	if r.hasGroup("postgres") {
		w("\nPostgreSQL: the advisory-lock rows are the baseline a Go program gets without a lock library, not a peer with the same guarantees. pglock sends one statement to acquire and one to release, each its own transaction (a row written, so a commit), and holds no connection between them; it gives a lease that expires by the database's clock if the holder dies or hangs, a fencing token per grant, and works behind a transaction pooler (PgBouncer). An advisory lock is a read-only call on a connection that the holder keeps for as long as it holds the lock (and a waiter for as long as it waits): it ends by an unlock (or the transaction's end) or when the session ends, so a holder that hangs with its connection open holds it for ever; it carries no token and is taken by the server's lock manager without writing anything. pglock is therefore expected to be slower than the baseline without contention (the advisory rows' ratios: below 1 for p50, above 1 for throughput); what that buys is listed above. In the contended table the advisory waiters block in the server, which hands the lock straight to the next one; pglock's waiters are woken by NOTIFY and then race with one statement each.\n")
	}
	if r.hasGroup("redis-ha") {
		w("\nReplica acknowledgement (the redis-ha rows): both run on the same Sentinel group, a primary with one replica on this machine. With acks=1 a grant (and each renewal) is followed by WAIT 1 on the connection that wrote it, in the same round trip, so it returns once the replica has the write: uncontended p50 %s and throughput %s of the same locker without acks, contended handoffs/s %s. On loopback the replica is microseconds away; across machines each grant also pays the round trip to the nearest acknowledging replica.\n",
			ratio(float64(r.unc[nDAcks].p50), float64(r.unc[nDSentinel].p50)), ratio(r.thr[nDAcks], r.thr[nDSentinel]), ratio(r.con[nDAcks].handoffsPerS, r.con[nDSentinel].handoffsPerS))
	}
	r.tairMarkdown(w)
	r.modesMarkdown(w)
	w("\n## Many held locks (dlock redislock, one client)\n\n")
	w("Each row acquires its locks from 32 goroutines, holds them, and is measured at the end of the hold, when every lock is renewed and listens for break notices. CPU is this process's (client, with the watchdog), not the Redis server's.\n\n")
	w("| locks | TTL (renewed every) | acquired in | held for | renewal round trips | renewals | round trips per tick | renewals/s | CPU | %% of one core | heap per lock | goroutines added | lost |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, h := range r.held {
		w("| %d | %v (%v) | %s | %v | %d | %d | %.1f | %.0f | %s | %.1f%% | %.0f B | %d | %d |\n",
			h.locks, h.ttl, h.ttl/3, h.acquireTime.Round(100*time.Millisecond), h.duration, h.roundTrips, h.renewals, float64(h.roundTrips)/h.ticks, float64(h.renewals)/h.duration.Seconds(),
			h.cpu.Round(time.Millisecond), 100*h.cpu.Seconds()/h.duration.Seconds(), h.bytesPerLock, h.goroutinesHeld, h.lost)
	}
	if len(r.held) > 0 {
		h := r.held[0]
		w("\nFor comparison, a Redisson-style watchdog (one timer task and one renewal round trip per lock per tick) would send %d round trips per tick for the first row instead of %.1f, i.e. %.0f round trips/s, and a goroutine-per-lock design in Go would add %d goroutines (at least 2 KiB of stack each, ~%d MiB).\n\n",
			h.locks, float64(h.roundTrips)/h.ticks, float64(h.locks)/(h.ttl/3).Seconds(), h.locks, h.locks*2/1024)
	}
	if len(r.errs) > 0 {
		w("## Errors during the run\n\n")
		for k, v := range r.errs {
			w("- %s: %s\n", k, v)
		}
		w("\n")
	}
	for _, l := range r.libs {
		if c := r.con[l.name]; c.firstErrorMsg != "" {
			w("- %s, first error while contended: %s\n", l.name, c.firstErrorMsg)
		}
	}
	return b.String()
}

// tairMarkdown writes the tair group's ratios to its floor, if the group
// ran.
func (r *report) tairMarkdown(w func(string, ...any)) {
	if !r.hasGroup("tair") {
		return
	}
	w("\nRedis without scripts (the tair rows): both run on one redis-server with the TairString module, as an ACL user that may not run scripts (+@all -@scripting), on go-redis clients with default options (a pool of 10 connections per CPU; the other Redis rows' clients have 64). redislock.New finds scripts refused and takes exclusive locks with TairString's CAS and CAD. Against its floor on the same server (SET NX, then CAD): uncontended p50 %s, throughput %s; contended handoffs/s %.0f",
		ratio(float64(r.unc[nDTair].p50), float64(r.unc[nTairFloor].p50)), ratio(r.thr[nDTair], r.thr[nTairFloor]), r.con[nDTair].handoffsPerS)
	w(". Against the scripts on the same server (the default user): uncontended p50 %s, throughput %s, handoffs/s %s.\n",
		ratio(float64(r.unc[nDTair].p50), float64(r.unc[nDTairScripts].p50)), ratio(r.thr[nDTair], r.thr[nDTairScripts]), ratio(r.con[nDTair].handoffsPerS, r.con[nDTairScripts].handoffsPerS))
}

// modesMarkdown writes the read-write lock and semaphore section.
func (r *report) modesMarkdown(w func(string, ...any)) {
	if len(r.modes) == 0 {
		return
	}
	w("\n## Read locks and semaphores: %d contenders on one key, each with its own connections, for %v\n\n", r.cfg.contenders, r.cfg.contend)
	w("Each contender loops acquire → release on one key, in the mode of the row. The read-lock rows compare the acquisitions/s of %d readers (dlock.WithShared(): they hold the key together) with the handoffs/s of the same backend's exclusive lock in the contended table (the same number of contenders on one key, one at a time). One server runs every grant of a key, so readers cannot go faster than the backend's own acquire + release rate (the throughput table, distinct keys): the read-lock ratio is bounded by that rate over the exclusive handoffs/s. The semaphore rows (dlock.WithLimit(%d)) are compared with the floor: an owner-less permit counter in one Lua script (take a permit if fewer than %d are taken, give it back with DECR; a refused attempt is retried at once), as Redisson's RSemaphore keeps permits. The floor records no holder, so a holder that dies keeps its permit for ever; a dlock permit is a lease of its own (owner, TTL, fencing token) that frees at its expiry. *Entries beyond the limit* counts entries (between the return of acquire and the call of release) that found the limit already inside, and must be 0; the sections are empty, as in the contended table, so this is a sanity check only: the safety matrix's redis-sem rows test the limit under faults.\n\n", r.cfg.contenders, semLimit, semLimit)
	w("| library | mode | acquisitions/s | vs exclusive handoffs/s | vs floor | entries beyond the limit | acquisitions | gave up |\n|---|---|---|---|---|---|---|---|\n")
	row := func(name, mode string, m modeResult, ex, floor float64) {
		if m.unsupported {
			w("| %s | %s | not supported by this backend | | | | | |\n", name, mode)
			return
		}
		beyond := "—"
		if m.limit > 0 {
			beyond = fmt.Sprint(m.overLimit)
		}
		w("| %s | %s | %.0f | %s | %s | %s | %d | %d |\n", name, mode, m.perS, ratio(m.perS, ex), ratio(m.perS, floor), beyond, m.acquisitions, m.failures)
	}
	for _, m := range r.modes {
		ex := r.con[m.lib.exclusive].handoffsPerS
		row(m.lib.name, "read lock: Acquire(WithShared())", m.read, ex, 0)
		row(m.lib.name, fmt.Sprintf("semaphore: Acquire(WithLimit(%d))", semLimit), m.sem, ex, m.floor.perS)
		if m.lib.semFloor != nil {
			row("floor: Lua permit counter", fmt.Sprintf("no owner, no TTL, no token, limit %d, retry at once", semLimit), m.floor, 0, m.floor.perS)
		}
	}
	for _, m := range r.modes {
		for _, x := range []struct {
			what string
			res  modeResult
		}{{"read lock", m.read}, {"semaphore", m.sem}, {"floor", m.floor}} {
			if x.res.firstErr != "" {
				w("\n- %s %s, first error: %s\n", m.lib.name, x.what, x.res.firstErr)
			}
		}
	}
}
