package redislock

import "github.com/dlock-go/dlock/driver"

// Option configures a Locker or a Guard: redislock's own options
// (WithPrefix) and the core's (dlock.WithObserver), in one list.
type Option = driver.Option

// config holds redislock's own settings.
type config struct {
	prefix string
}

// WithPrefix sets the key prefix (default DefaultPrefix; an empty prefix
// means the default). Lockers must use the same prefix to exclude each
// other, and Guards to share their fences.
func WithPrefix(p string) Option {
	return driver.Setting(func(c *config) { c.prefix = p })
}

// newConfig applies opts to the defaults.
func newConfig(opts []Option) config {
	c := config{prefix: DefaultPrefix}
	driver.Apply(&c, opts)
	if c.prefix == "" {
		c.prefix = DefaultPrefix
	}
	return c
}
