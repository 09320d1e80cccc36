package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/filelock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// openLocker opens the backend a worker locks with, from a spec
// "redis:ADDR", "redlock:ADDR,ADDR,...", "etcd:URL,URL,..." or
// "file:DIR". Clients are the libraries' defaults: no promise may depend
// on the user's client settings.
func openLocker(spec string) (dlock.Locker, func(), error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, nil, fmt.Errorf("bad backend spec %q", spec)
	}
	switch kind {
	case "redis":
		c := redis.NewClient(&redis.Options{Addr: arg})
		return redislock.New(c), func() { c.Close() }, nil
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
	case "file":
		l, err := filelock.New(arg)
		if err != nil {
			return nil, nil, err
		}
		return l, func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown backend %q", kind)
}
