//go:build linux

package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// On a terminal, --verbose draws a progress line on a long wait ("\r...
// waiting 2s for KEY (held by ...)", redrawn in place every second from
// 2s on) and erases it before "acquired"; CMD then runs.
func TestPtyVerboseProgressLine(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	holder, _, _ := background(t, url, "run", "k", "--", "sh", "-c", "echo started; exec sleep 60")
	cmd, _, out := startOnPty(t, "run", "--url", url, "--verbose", "k", "--", "echo", "ran-under-lock")
	progress := regexp.MustCompile(`\rdlock run: waiting (\d+)s for "k" \(held by owner [0-9a-f]{12} on \S+ pid \d+ at the first attempt\)\x1b\[K`)
	// Two draws: the line is redrawn in place as the wait goes on.
	waitFor(t, hang, "no progress line redrawn", func() bool { return len(progress.FindAllString(out.String(), -1)) >= 2 })
	if strings.Contains(out.String(), "ran-under-lock") {
		t.Fatalf("CMD ran while the lock was held:\n%q", out.String())
	}
	holder.Process.Signal(syscall.SIGTERM)
	waitFor(t, hang, "CMD never ran", func() bool { return strings.Contains(out.String(), "ran-under-lock") })
	if code := waitExit(t, cmd); code != 0 {
		t.Fatalf("exit %d:\n%q", code, out.String())
	}
	s := out.String()
	draws := progress.FindAllStringIndex(s, -1)
	last := draws[len(draws)-1][1]
	clear := strings.Index(s[last:], "\r\x1b[K")
	acquired := strings.Index(s[last:], `dlock run: acquired "k" after `)
	if clear < 0 || acquired < clear || strings.Contains(s[last:last+acquired], "waiting") {
		t.Fatalf("the progress line was not erased before the acquired line:\n%q", s)
	}
	for _, m := range progress.FindAllStringSubmatch(s, -1) {
		if m[1] == "0" || m[1] == "1" {
			t.Fatalf("a progress line before 2s of waiting: %q", m[0])
		}
	}
}
