// Package deps pins the harness's dependencies until the code using them
// lands (removed then).
package deps

import (
	_ "github.com/anishathalye/porcupine"
	_ "github.com/dlock-go/dlock/etcdlock"
	_ "github.com/dlock-go/dlock/redislock"
	_ "github.com/dlock-go/dlock/redlock"
	_ "github.com/redis/go-redis/v9"
	_ "go.etcd.io/etcd/client/v3"
)
