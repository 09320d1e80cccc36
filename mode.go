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
// shared locks refuse it with an error wrapping ErrUnsupported. Combined
// with WithLimit, in either order, it is an error wrapping
// ErrInvalidOption.
func WithShared() Option {
	return func(c *config) { c.shared = true }
}

// WithLimit asks for one of n permits on the key (a counting semaphore):
// at most n Limited holders at once. Backends that do not support counted
// locks refuse it with an error wrapping ErrUnsupported. n outside
// [1, MaxLimit] is an error wrapping ErrInvalidOption (also when another
// WithLimit follows), and so is WithLimit combined with WithShared.
func WithLimit(n int) Option {
	return func(c *config) {
		c.limited, c.limit = true, n
		if (n < 1 || n > MaxLimit) && c.modeErr == nil {
			c.modeErr = fmt.Errorf("%w: limit %d must be in [1, %d]", ErrInvalidOption, n, MaxLimit)
		}
	}
}

// resolveMode sets c.mode from WithShared and WithLimit, or returns their
// error.
func (c *config) resolveMode() error {
	switch {
	case c.modeErr != nil:
		return c.modeErr
	case c.shared && c.limited:
		return fmt.Errorf("%w: WithShared and WithLimit(%d) cannot be combined", ErrInvalidOption, c.limit)
	case c.shared:
		c.mode, c.limit = Shared, 0
	case c.limited:
		c.mode = Limited
	}
	return nil
}
