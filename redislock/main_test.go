package redislock_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func newClient(t testing.TB, srv *testserver.Redis) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: srv.Password()})
	t.Cleanup(func() { c.Close() })
	return c
}
