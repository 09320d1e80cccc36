package redisproto_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr}) // a default client
	t.Cleanup(func() { c.Close() })
	return c
}

// patientClient is a client whose reads and writes wait past
// dlocktest.HangTimeout: a call that waits on a hung link then hangs
// until the test calls it a hang, rather than returning after the
// client's own timeouts (a default client's 3s read timeout and retries).
func patientClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 2 * dlocktest.HangTimeout, WriteTimeout: 2 * dlocktest.HangTimeout})
	t.Cleanup(func() { c.Close() })
	return c
}

func key(t testing.TB) string { return fmt.Sprintf("%s.%d", t.Name(), time.Now().UnixNano()) }
