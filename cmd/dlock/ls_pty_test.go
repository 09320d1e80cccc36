//go:build linux

package main

import (
	"strings"
	"testing"
)

// On a terminal --watch redraws the screen (clear, then a header) instead
// of printing timestamp lines.
func TestLsWatchRedrawsTerminal(t *testing.T) {
	t.Parallel()
	cmd, _, out := startOnPty(t, "ls", "--watch", "200ms", "--count", "2")
	if code := waitExit(t, cmd); code != 0 {
		t.Fatalf("ls --watch on a terminal: exit %d: %q", code, out.String())
	}
	// The reader of the terminal may lag behind the exit.
	waitFor(t, hang, "two screens never came", func() bool { return strings.Count(out.String(), "Every 200ms: dlock ls") == 2 })
	s := out.String()
	if strings.Count(s, "\x1b[2J") != 2 || strings.Contains(s, "--- ") || strings.Count(s, "no locks held") != 2 {
		t.Fatalf("ls --watch on a terminal: %q", s)
	}
}
