package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/zklock"
)

// benchTTL is the lease every library gets where it takes one.
const benchTTL = 30 * time.Second

// locker is one contender's handle on a library, with its own connections.
type locker interface {
	// lock blocks (in the library's documented blocking mode) until key is
	// held and returns the function that releases it.
	lock(ctx context.Context, key string) (unlock func(ctx context.Context) error, err error)
	close()
}

// lib is a library under test.
type lib struct {
	name string
	// mode states the blocking mode and settings used, for the report.
	mode string
	// group: libraries compared with each other ("redis", "redis-ha",
	// "tair", "redlock", "etcd", "zookeeper", "postgres").
	group string
	// newLocker makes a contender with its own client connections.
	newLocker func() (locker, error)
	// contended: take part in the contention scenario.
	contended bool
}

type env struct {
	redis   []string // addresses of independent redis-servers (first = single)
	etcdEPs []string
	zk      []string // one standalone ZooKeeper server
	pg      string   // DSN of one PostgreSQL server
	// sentinel: a primary with one replica, watched by one sentinel.
	sentinelMaster string
	sentinels      []string
	// tair: a redis-server with the TairString module and the ACL user
	// testserver.NoScriptsUser ("" where the module is not available).
	tair string
}

// failoverClient is a default go-redis Sentinel client of e's group.
func failoverClient(e *env) *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: e.sentinelMaster, SentinelAddrs: e.sentinels, PoolSize: 64})
}

func redisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
}

// tairClient is a go-redis client with default options on the Tair
// server at addr, logged in as the user that may not run scripts.
func tairClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Username: testserver.NoScriptsUser, Password: testserver.NoScriptsPassword})
}

// libraries are the libraries of every group; the tair group only where
// its server runs.
func libraries(e *env) []lib {
	libs := baseLibraries(e)
	if e.tair != "" {
		libs = append(libs, tairLibraries(e.tair)...)
	}
	return libs
}

// tairLibraries are the tair group, on the Tair server at addr as the
// user that may not run scripts: redislock's default locker, which finds
// scripts refused and takes exclusive locks with TairString's CAS and
// CAD, and its floor.
func tairLibraries(addr string) []lib {
	return []lib{
		{name: nTairFloor, group: "tair", mode: "raw go-redis as the no-scripts user: SET NX, then the CAD command; no waiting (uncontended only)",
			newLocker: func() (locker, error) { return &tairFloor{c: tairClient(addr)}, nil }},
		{name: nDTair, group: "tair", contended: true, mode: "redislock.New with defaults, as an ACL user that may not run scripts (+@all -@scripting) on a server with TairString: CAS and CAD instead of Lua; Acquire (pub/sub wake-up, backoff fallback 5-500ms), default watchdog; default go-redis options",
			newLocker: func() (locker, error) {
				c := tairClient(addr)
				return &dlockLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
			}},
		{name: nDTairScripts, group: "tair", contended: true, mode: "redislock.New with defaults on the same server, as the default user, who may run scripts: Lua, as on any Redis; default go-redis options",
			newLocker: func() (locker, error) {
				c := redis.NewClient(&redis.Options{Addr: addr})
				return &dlockLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
			}},
	}
}

// baseLibraries are the libraries of the groups on servers that need no
// module.
func baseLibraries(e *env) []lib {
	one := e.redis[0]
	five := e.redis[:5]
	return []lib{
		{name: "floor: SET NX PX + CAD", group: "redis", mode: "raw go-redis, no waiting (uncontended only)",
			newLocker: func() (locker, error) { return &floor{c: redisClient(one)}, nil }},
		{name: "dlock redislock", group: "redis", contended: true, mode: "Acquire (pub/sub wake-up, backoff fallback 5-500ms), default watchdog",
			newLocker: func() (locker, error) {
				c := redisClient(one)
				return &dlockLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
			}},
		{name: nDSentinel, group: "redis-ha", contended: true, mode: "redislock.New on a default Sentinel client; the primary has one replica (asynchronous replication)",
			newLocker: func() (locker, error) {
				c := failoverClient(e)
				return &dlockLocker{l: redislock.New(c), close_: func() { c.Close() }}, nil
			}},
		{name: nDAcks, group: "redis-ha", contended: true, mode: "the same, with redislock.WithReplicaAcks(1, 0): each grant and renewal is followed by WAIT 1 on its connection, in the same round trip",
			newLocker: func() (locker, error) {
				c := failoverClient(e)
				return &dlockLocker{l: redislock.New(c, redislock.WithReplicaAcks(1, 0)), close_: func() { c.Close() }}, nil
			}},
		{name: "bsm/redislock", group: "redis", contended: true, mode: "Obtain with LinearBackoff(10ms) retry",
			newLocker: func() (locker, error) { return &bsmLocker{c: redisClient(one)}, nil }},
		{name: "redsync (1 pool)", group: "redis", contended: true, mode: "Mutex.LockContext, defaults (32 tries, 50-250ms random delay)",
			newLocker: func() (locker, error) { return newRedsync([]string{one}), nil }},
		{name: "rueidislock", group: "redis", contended: true, mode: "WithContext, defaults (KeyMajority 2, waits on invalidations)",
			newLocker: func() (locker, error) {
				l, err := rueidislock.NewLocker(rueidislock.LockerOption{ClientOption: rueidis.ClientOption{InitAddress: []string{one}}})
				if err != nil {
					return nil, err
				}
				return &rueidisLocker{l: l}, nil
			}},
		{name: "dlock redlock (5 nodes)", group: "redlock", contended: true, mode: "Acquire, defaults",
			newLocker: func() (locker, error) {
				var cs []redis.UniversalClient
				for _, a := range five {
					cs = append(cs, redisClient(a))
				}
				return &dlockLocker{l: redlock.New(cs), close_: func() {
					for _, c := range cs {
						c.Close()
					}
				}}, nil
			}},
		{name: "redsync (5 pools)", group: "redlock", contended: true, mode: "Mutex.LockContext, defaults",
			newLocker: func() (locker, error) { return newRedsync(five), nil }},
		{name: "dlock etcdlock", group: "etcd", contended: true, mode: "Acquire (FIFO queue, watch on predecessor)",
			newLocker: func() (locker, error) {
				c, err := clientv3.New(clientv3.Config{Endpoints: e.etcdEPs, DialTimeout: 5 * time.Second})
				if err != nil {
					return nil, err
				}
				return &dlockLocker{l: etcdlock.New(c), close_: func() { c.Close() }}, nil
			}},
		{name: "etcd concurrency.Mutex", group: "etcd", contended: true, mode: "Mutex.Lock on one session per contender",
			newLocker: func() (locker, error) {
				c, err := clientv3.New(clientv3.Config{Endpoints: e.etcdEPs, DialTimeout: 5 * time.Second})
				if err != nil {
					return nil, err
				}
				s, err := concurrency.NewSession(c, concurrency.WithTTL(int(benchTTL/time.Second)))
				if err != nil {
					c.Close()
					return nil, err
				}
				return &etcdMutex{c: c, s: s}, nil
			}},
		{name: "dlock zklock", group: "zookeeper", contended: true, mode: fmt.Sprintf("Acquire (FIFO queue, watch on predecessor), zklock.Connect session %v (lease %v)", benchTTL, zklock.LeaseOf(benchTTL)),
			newLocker: func() (locker, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c, err := zklock.Connect(ctx, e.zk, benchTTL, zklock.WithLogger(quiet{}))
				if err != nil {
					return nil, err
				}
				return &dlockLocker{l: zklock.New(c), close_: c.Close}, nil
			}},
		{name: "go-zookeeper zk.Lock", group: "zookeeper", contended: true, mode: "zk.NewLock, Lock/Unlock (FIFO queue, watch on predecessor), one session per contender",
			newLocker: func() (locker, error) {
				c, err := zkPeerConnect(e.zk)
				if err != nil {
					return nil, err
				}
				return &zkLock{c: c}, nil
			}},
		{name: "dlock pglock", group: "postgres", contended: true, mode: fmt.Sprintf("Acquire (LISTEN/NOTIFY wake-up of one waiting writer, backoff fallback 5-500ms), default watchdog, pglock.New on a default pgxpool (%d conns): one statement per acquire and one per release, a lease by the database's clock, a fencing token, no session state (pooler-safe)", pgMaxConns(e.pg)),
			newLocker: func() (locker, error) {
				pool, err := pgPool(e.pg)
				if err != nil {
					return nil, err
				}
				return warm(&dlockLocker{l: pglock.New(pool), close_: pool.Close})
			}},
		{name: "advisory lock (session)", group: "postgres", contended: true, mode: "baseline on the same server and pool: pg_try_advisory_lock(hashtext(key)) on a pooled connection kept while the lock is held, pg_advisory_unlock on it; a waiter blocks in pg_advisory_lock, so the server hands over the lock itself (the fastest hand-off PostgreSQL has; a try+retry loop could only be slower). No lease, no fencing token, a connection per held lock and per waiter, not pooler-safe",
			newLocker: func() (locker, error) {
				pool, err := pgPool(e.pg)
				if err != nil {
					return nil, err
				}
				return warm(&pgAdvisory{pool: pool})
			}},
		{name: "advisory lock (transaction)", group: "postgres", contended: true, mode: "baseline: BEGIN; pg_try_advisory_xact_lock(hashtext(key)) (a waiter blocks in pg_advisory_xact_lock); COMMIT releases. The lock lives as long as a transaction held open on a pooled connection. No lease, no fencing token",
			newLocker: func() (locker, error) {
				pool, err := pgPool(e.pg)
				if err != nil {
					return nil, err
				}
				return warm(&pgXactAdvisory{pool: pool})
			}},
	}
}

// floor is the physical limit: SET NX PX, then compare-and-delete.
type floor struct{ c *redis.Client }

var cad = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (f *floor) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	owner, err := floorAcquire(ctx, f.c, key)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return cad.Run(ctx, f.c, []string{key}, owner).Err() }, nil
}
func (f *floor) close() { f.c.Close() }

// floorAcquire is the floors' acquire: SET key to a new owner, NX, with
// the bench TTL. It fails if key is held.
func floorAcquire(ctx context.Context, c *redis.Client, key string) (owner string, err error) {
	owner = dlock.NewOwner()
	ok, err := c.SetNX(ctx, key, owner, benchTTL).Result()
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errors.New("floor: key held")
	}
	return owner, nil
}

// tairFloor is the floor on a server with TairString, for a user that may
// not run scripts: the floor's SET NX, then TairString's CAD command
// (compare-and-delete) in place of the script.
type tairFloor struct{ c *redis.Client }

func (f *tairFloor) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	owner, err := floorAcquire(ctx, f.c, key)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return f.c.Do(ctx, "CAD", key, owner).Err() }, nil
}
func (f *tairFloor) close() { f.c.Close() }

type dlockLocker struct {
	l      dlock.Locker
	close_ func()
}

func (d *dlockLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	lk, err := d.l.Acquire(ctx, key, dlock.WithTTL(benchTTL))
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}
func (d *dlockLocker) close() { d.close_() }

type bsmLocker struct{ c *redis.Client }

func (b *bsmLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := bsm.New(b.c).Obtain(ctx, key, benchTTL, &bsm.Options{RetryStrategy: bsm.LinearBackoff(10 * time.Millisecond)})
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}
func (b *bsmLocker) close() { b.c.Close() }

type redsyncLocker struct {
	rs *redsync.Redsync
	cs []*redis.Client
}

func newRedsync(addrs []string) *redsyncLocker {
	r := &redsyncLocker{}
	var pools []rsredis.Pool
	for _, a := range addrs {
		c := redisClient(a)
		r.cs = append(r.cs, c)
		pools = append(pools, goredis.NewPool(c))
	}
	r.rs = redsync.New(pools...)
	return r
}

func (r *redsyncLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	m := r.rs.NewMutex(key, redsync.WithExpiry(benchTTL))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("redsync: unlock of %s refused", key)
		}
		return err
	}, nil
}
func (r *redsyncLocker) close() {
	for _, c := range r.cs {
		c.Close()
	}
}

type rueidisLocker struct{ l rueidislock.Locker }

func (r *rueidisLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	_, cancel, err := r.l.WithContext(ctx, key)
	if err != nil {
		return nil, err
	}
	return func(context.Context) error { cancel(); return nil }, nil
}
func (r *rueidisLocker) close() { r.l.Close() }

type etcdMutex struct {
	c *clientv3.Client
	s *concurrency.Session
}

func (m *etcdMutex) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	mu := concurrency.NewMutex(m.s, key)
	if err := mu.Lock(ctx); err != nil {
		return nil, err
	}
	return mu.Unlock, nil
}
func (m *etcdMutex) close() { m.s.Close(); m.c.Close() }

// quiet drops go-zookeeper's log lines.
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// quietRedis silences go-redis's own log (a Sentinel client logs every
// master it resolves: one line per contender, in the middle of the
// progress lines).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// zkPeerPrefix is the znode under which go-zookeeper's zk.Lock keeps its
// locks (one child per key, created by Lock, persistent); zklock's are
// under zklock.DefaultPrefix.
const zkPeerPrefix = "/bench-zk"

// zkPeerConnect connects the way a go-zookeeper program does (zk.Connect)
// and waits, at most 20s, for the session.
func zkPeerConnect(servers []string) (*zk.Conn, error) {
	c, _, err := zk.Connect(servers, benchTTL, zk.WithLogger(quiet{}))
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(20 * time.Second); c.State() != zk.StateHasSession; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.Close()
			return nil, fmt.Errorf("zookeeper %v: no session after 20s", servers)
		}
	}
	return c, nil
}

// zkLock is go-zookeeper's own recipe. Its Lock takes no context: where
// ctx can end, Lock runs on a goroutine and a Lock that returns after ctx
// ended is unlocked there (closing the connection ends a pending one).
type zkLock struct{ c *zk.Conn }

var zkACL = zk.WorldACL(zk.PermAll)

func (z *zkLock) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	m := zk.NewLock(z.c, zkPeerPrefix+"/"+key, zkACL)
	unlock := func(context.Context) error { return m.Unlock() }
	if ctx.Done() == nil {
		if err := m.Lock(); err != nil {
			return nil, err
		}
		return unlock, nil
	}
	done := make(chan error, 1)
	go func() { done <- m.Lock() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
		return unlock, nil
	case <-ctx.Done():
		go func() {
			if <-done == nil {
				m.Unlock()
			}
		}()
		return nil, fmt.Errorf("zk.Lock %s: %w", key, context.Cause(ctx))
	}
}
func (z *zkLock) close() { z.c.Close() }

// pgPool is a pgxpool with its defaults (as pgxpool.New gives), on dsn.
func pgPool(dsn string) (*pgxpool.Pool, error) {
	return pgxpool.New(context.Background(), dsn)
}

// pgMaxConns is the size of a default pool on dsn (pgxpool's default:
// the larger of 4 and the number of CPUs).
func pgMaxConns(dsn string) int32 {
	c, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return 0
	}
	return c.MaxConns
}

// warm takes and releases one lock on a fresh key, so that a contender
// starts with a connection dialled and its statements prepared (and
// pglock's first-use schema check done) like the clients of the other
// groups, which connect before they are measured. On failure it closes lk.
func warm(lk locker) (locker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	un, err := lk.lock(ctx, uniqueKey("warm"))
	if err == nil {
		err = un(ctx)
	}
	if err != nil {
		lk.close()
		return nil, err
	}
	return lk, nil
}

// pgAdvisory is a session advisory lock: a connection out of the pool for
// as long as the lock is held, the lock taken and released on it.
type pgAdvisory struct{ pool *pgxpool.Pool }

// discard closes c's connection before it goes back to the pool (which
// then drops it): after an error the session may hold the lock (a wait
// cancelled just as it was granted), and only its end releases that.
func discard(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Conn().Close(ctx)
	c.Release()
}

func (a *pgAdvisory) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	c, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	var ok bool
	err = c.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", key).Scan(&ok)
	if err == nil && !ok {
		_, err = c.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", key)
	}
	if err != nil {
		discard(c)
		return nil, fmt.Errorf("advisory lock %s: %w", key, err)
	}
	return func(ctx context.Context) error {
		var ok bool
		err := c.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtext($1))", key).Scan(&ok)
		if err == nil && !ok {
			err = errors.New("not held")
		}
		if err != nil {
			discard(c)
			return fmt.Errorf("advisory unlock %s: %w", key, err)
		}
		c.Release()
		return nil
	}, nil
}
func (a *pgAdvisory) close() { a.pool.Close() }

// pgXactAdvisory is a transaction-scoped advisory lock: the lock is held
// by an open transaction and released by its end.
type pgXactAdvisory struct{ pool *pgxpool.Pool }

func (a *pgXactAdvisory) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	var ok bool
	err = tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(hashtext($1))", key).Scan(&ok)
	if err == nil && !ok {
		_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", key)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		tx.Rollback(rctx) // closes the connection if it cannot roll back
		cancel()
		return nil, fmt.Errorf("advisory xact lock %s: %w", key, err)
	}
	return tx.Commit, nil
}
func (a *pgXactAdvisory) close() { a.pool.Close() }
