module github.com/dlock-go/dlock/safety

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/dlock-go/dlock v0.2.0
	github.com/dlock-go/dlock/etcdlock v0.2.0
	github.com/dlock-go/dlock/pglock v0.2.0
	github.com/dlock-go/dlock/redislock v0.2.0
	github.com/dlock-go/dlock/redlock v0.2.0
	github.com/dlock-go/dlock/zklock v0.2.0
	github.com/go-zookeeper/zk v1.0.4 // indirect
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	go.etcd.io/etcd/client/v3 v3.7.3
	golang.org/x/sys v0.49.0
)

// zklock is not published yet: the workspace provides it (go.work);
// this replace only spares the go command a lookup of v0.2.0.
replace github.com/dlock-go/dlock/zklock => ../zklock

// pglock is not published yet either.
replace github.com/dlock-go/dlock/pglock => ../pglock
