package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/zklock"
)

// openLocker opens the backend a worker locks with, from a spec
// "redis:[USER:PASSWORD@]ADDR" (as that ACL user if given),
// "sentinel:MASTER@ADDR,ADDR,...[?acks=N]" (a failover
// client of the sentinels at the ADDRs; acks=N: WithReplicaAcks(N,
// redislock.DefaultAckTimeout)), "redlock:ADDR,ADDR,...", "etcd:URL,URL,...",
// "zk:ADDR,ADDR,...@SESSIONTIMEOUT", "pg:DSN" or "file:DIR". Clients are
// the libraries' defaults: no promise may depend on the user's client
// settings. A ZooKeeper lock's lease comes from its session (two thirds of
// the timeout the ensemble granted), not from the worker's TTL, so the
// session timeout is part of the spec. A PostgreSQL pool is pgxpool's
// default configuration for the DSN (a libpq URL or key=value string):
// whatever the DSN says, and nothing else.
func openLocker(spec string) (dlock.Locker, func(), error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, nil, fmt.Errorf("bad backend spec %q", spec)
	}
	switch kind {
	case "redis":
		opts, err := redisOptions(spec, arg)
		if err != nil {
			return nil, nil, err
		}
		c := redis.NewClient(opts)
		return redislock.New(c), func() { c.Close() }, nil
	case "sentinel":
		return openSentinel(spec, arg)
	case "redlock":
		var cs []redis.UniversalClient
		for _, a := range strings.Split(arg, ",") {
			cs = append(cs, redis.NewClient(&redis.Options{Addr: a}))
		}
		return redlock.New(cs), func() {
			for _, c := range cs {
				c.Close()
			}
		}, nil
	case "etcd":
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(arg, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, nil, err
		}
		return etcdlock.New(c), func() { c.Close() }, nil
	case "zk":
		addrs, st, ok := strings.Cut(arg, "@")
		session, err := time.ParseDuration(st)
		if !ok || addrs == "" || err != nil {
			return nil, nil, fmt.Errorf("bad zk spec %q: want zk:ADDR,ADDR,...@SESSIONTIMEOUT", spec)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := zklock.Connect(ctx, strings.Split(addrs, ","), session)
		if err != nil {
			return nil, nil, err
		}
		return zklock.New(c), func() { c.Close() }, nil
	case "pg":
		pool, err := pgxpool.New(context.Background(), arg)
		if err != nil {
			return nil, nil, err
		}
		return pglock.New(pool), pool.Close, nil
	case "file":
		l, err := filelock.New(arg)
		if err != nil {
			return nil, nil, err
		}
		return l, func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown backend %q", kind)
}

// redisOptions are go-redis's default client options for the argument of
// a "redis:" spec, [USER:PASSWORD@]ADDR: the address and, if given, the
// ACL user to connect as. The credentials end at the last "@" (an address
// has none), the user name at the first ":".
func redisOptions(spec, arg string) (*redis.Options, error) {
	bad := func(why string) error {
		return fmt.Errorf("bad redis spec %q: %s; want redis:[USER:PASSWORD@]ADDR", spec, why)
	}
	opts := &redis.Options{Addr: arg}
	if i := strings.LastIndexByte(arg, '@'); i >= 0 {
		user, password, ok := strings.Cut(arg[:i], ":")
		if !ok || user == "" {
			return nil, bad("credentials without a user name and a password")
		}
		opts = &redis.Options{Addr: arg[i+1:], Username: user, Password: password}
	}
	if _, _, err := net.SplitHostPort(opts.Addr); err != nil {
		return nil, bad(err.Error())
	}
	return opts, nil
}

// openSentinel opens a redislock Locker on a go-redis failover client
// (its defaults) from the argument of a "sentinel:" spec.
func openSentinel(spec, arg string) (dlock.Locker, func(), error) {
	arg, query, hasQuery := strings.Cut(arg, "?")
	master, addrs, ok := strings.Cut(arg, "@")
	if !ok || master == "" || addrs == "" || strings.Contains(addrs, "@") {
		return nil, nil, fmt.Errorf("bad sentinel spec %q: want sentinel:MASTER@ADDR,ADDR,...[?acks=N]", spec)
	}
	for _, a := range strings.Split(addrs, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, nil, fmt.Errorf("bad sentinel spec %q: sentinel address %q: %v", spec, a, err)
		}
	}
	var opts []redislock.Option
	if hasQuery {
		v, ok := strings.CutPrefix(query, "acks=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 {
			return nil, nil, fmt.Errorf("bad sentinel spec %q: the only option is acks=N, N ≥ 1", spec)
		}
		opts = append(opts, redislock.WithReplicaAcks(n, redislock.DefaultAckTimeout))
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: strings.Split(addrs, ",")})
	return redislock.New(c, opts...), func() { c.Close() }, nil
}
