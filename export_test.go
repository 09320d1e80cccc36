package dlock

// Test hooks for the external tests of package dlock.

// Config and NewConfig expose option resolution.
type Config = config

var NewConfig = newConfig

// Renewing reports how many locks e's watchdog keeps alive.
func Renewing(e *Engine) int { return e.renewing() }
