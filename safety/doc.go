// Package safety is dlock's safety harness: worker processes take a lock
// and update a shared register through it while real faults hit real
// servers; a checker reads the history and counts what broke (overlapping
// holders, stale writes accepted, lost updates, token regressions) and
// what fencing saved. `make safety` writes the matrix to docs/safety.md.
//
// The module is not published: it tests dlock, users do not import it.
package safety
