// Package observe hands dlock.WithObserver's Observer to the packages that
// report Events without an Engine (guards), without a driver-facing
// function in dlock's user API.
package observe

import "github.com/dlock-go/dlock/driver"

// Of returns the Observer that dlock.WithObserver set among opts, as a
// dlock.Observer that recovers its own panics, or nil (none, or a typed
// nil). Package dlock sets it when it is initialised, before any package
// that imports dlock can call it.
var Of func(opts []driver.Option) any
