module github.com/dlock-go/dlock/redlock

go 1.25

require (
	github.com/dlock-go/dlock v0.2.0
	github.com/dlock-go/dlock/redislock v0.2.0
	github.com/redis/go-redis/v9 v9.22.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
