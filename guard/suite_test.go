package guard_test

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/guard/guardtest"
)

func TestMemorySuite(t *testing.T) {
	guardtest.Run(t, func(t *testing.T, opts ...driver.Option) guard.Guard {
		return guard.NewMemory(opts...)
	})
}
