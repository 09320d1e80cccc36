// Package bench measures dlock against the physical floor of each backend
// and against peer libraries, on servers it starts itself on loopback. It
// is never imported by dlock. Run it with `make bench`.
package bench
