package main

import "testing"

// Symptom: --ttl above dlock.MaxTTL came back from the library after connecting as "dlock run: dlock: invalid ttl", one line without the pointer to --help.
// A --ttl above dlock.MaxTTL is a usage error of the option, found before
// connecting.
func TestRun_TTLAboveMaximumIsUsageErrorBeforeConnecting(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "hold"} {
		args := []string{cmd, "--ttl", "169h", "k"}
		if cmd == "run" {
			args = append(args, "--", "true")
		}
		// An unreachable URL: the error must come before any connecting.
		usageLines(t, runDlock(t, "redis://"+deadAddr(t), args...), cmd, "--ttl 169h0m0s is above the maximum", args)
	}
}
