package dlockprom_test

import (
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

// TestMain checks for leaked goroutines (the tests hold memlock locks,
// whose watchdogs run on goroutines).
func TestMain(m *testing.M) { testserver.Main(m) }
