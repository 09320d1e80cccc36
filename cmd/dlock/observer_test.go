package main

import (
	"strings"
	"testing"
)

// --verbose reports the lock's life through dlock's log/slog Observer.
func TestRunVerboseLogsLockEvents(t *testing.T) {
	t.Parallel()
	r := runDlock(t, fileURL(t), "run", "--verbose", "job", "--", "true")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"msg=lock_acquired", "key=job", "backend=file", "msg=lock_released"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	// Without --verbose, nothing of the kind.
	if r := runDlock(t, fileURL(t), "run", "job", "--", "true"); strings.Contains(r.stderr, "lock_acquired") {
		t.Errorf("events logged without --verbose:\n%s", r.stderr)
	}
}

// ls --json shows one row per holder, with its mode.
func TestLsJSONHasMode(t *testing.T) {
	t.Parallel()
	url := fileURL(t)
	background(t, url, "run", "jobs/a", "--", "sh", "-c", "echo started; exec sleep 60")
	r := runDlock(t, url, "ls", "--json", "jobs/")
	if r.code != 0 || !strings.Contains(r.stdout, `"mode": "exclusive"`) || !strings.Contains(r.stdout, `"key": "jobs/a"`) {
		t.Fatalf("ls --json: %d %q %q", r.code, r.stdout, r.stderr)
	}
}
