//go:build !linux

package main

// normalPriority: outside Linux the harness keeps the priority it was
// started with (see priority_linux.go).
func normalPriority() int { return 0 }
