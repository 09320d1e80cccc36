module github.com/dlock-go/dlock/examples

go 1.26.0

require (
	github.com/dlock-go/dlock v0.2.0
	github.com/dlock-go/dlock/etcdlock v0.2.0
	github.com/dlock-go/dlock/pglock v0.2.0
	github.com/dlock-go/dlock/redislock v0.2.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	go.etcd.io/etcd/client/v3 v3.7.3
	go.uber.org/goleak v1.3.0
)
