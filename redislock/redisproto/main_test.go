package redisproto_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// hangBound bounds calls that must not wait on the network; the defects
// they catch wait for go-redis's 5s read timeout and retries.
const hangBound = 4 * time.Second

func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr}) // a default client
	t.Cleanup(func() { c.Close() })
	return c
}

func key(t testing.TB) string { return fmt.Sprintf("%s.%d", t.Name(), time.Now().UnixNano()) }
