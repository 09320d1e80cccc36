package dlock

import (
	"fmt"

	"github.com/dlock-go/dlock/driver"
)

// Mode is how a lock shares its key.
type Mode uint8

const (
	// Exclusive: one holder at a time. The default.
	Exclusive = Mode(driver.Exclusive)
	// Shared: any number of Shared holders and no Exclusive one (a read
	// lock; WithShared).
	Shared = Mode(driver.Shared)
	// Limited: at most N Limited holders (a semaphore; WithLimit).
	Limited = Mode(driver.Limited)
)

// String returns "exclusive", "shared" or "limited".
func (m Mode) String() string { return driver.Mode(m).String() }

// MaxLimit bounds WithLimit.
const MaxLimit = 1 << 20

// WithShared asks for a shared (read) lock: it is held together with other
// shared holders and excludes exclusive ones. Backends that do not support
// shared locks refuse it with an error wrapping ErrUnsupported.
func WithShared() Option {
	return func(c *config) { c.mode, c.limit, c.modeErr = Shared, 0, nil }
}

// WithLimit asks for one of n permits on the key (a counting semaphore):
// at most n Limited holders at once. Backends that do not support counted
// locks refuse it with an error wrapping ErrUnsupported.
func WithLimit(n int) Option {
	return func(c *config) {
		c.mode, c.limit, c.modeErr = Limited, n, nil
		if n < 1 || n > MaxLimit {
			c.modeErr = fmt.Errorf("%w: limit %d must be in [1, %d]", ErrInvalidOption, n, MaxLimit)
		}
	}
}
