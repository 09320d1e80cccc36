package dlockprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Red team (issue 15): edge series for alerts.yml, as promtool unit tests
// (redteam15_alerts_test.yml): a scrape gap made every old nonzero
// fencing/lost total fire again; no traffic (NaN ratios), counter resets
// and restarts must not fire falsely nor hide an event.
func TestRedTeam15_AlertEdgeSeries(t *testing.T) {
	bin := promtool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "test", "rules", "redteam15_alerts_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules redteam15_alerts_test.yml: %v\n%s", err, out)
	}
}

// Red team (issue 15): a Lock lost (on the watchdog's goroutine) while its
// call was still reporting EventAcquire reached the Observer as lost
// before acquired, and locks_held counted it held for ever (and its entry
// stayed in the Observer's map). dlock now reports a Lock's Events after
// its EventAcquire. The stall is a call observer placed before dlockprom's.
func TestRedTeam15_LossDuringAcquireLeavesNothingHeld(t *testing.T) {
	reg, obs := newObs(t)
	ml := memlock.New()
	lostSeen := make(chan struct{})
	var once sync.Once
	var stalled atomic.Bool
	stall := dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventLost {
			once.Do(func() { close(lostSeen) })
		}
		if e.Kind != dlock.EventAcquire || e.Result != dlock.ResultAcquired || !stalled.CompareAndSwap(false, true) {
			return
		}
		ml.Expire(e.Key)
		select { // bounded: with the fix the loss waits for this Event
		case <-lostSeen:
		case <-time.After(2 * time.Second):
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lk, err := ml.Acquire(ctx, "k", dlock.WithTTL(dlock.MinTTL), dlock.WithCallObserver(stall), dlock.WithCallObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the expired lock was not lost")
	}
	waitFor(t, reg, "dlock_lost_total", with("reason", string(dlock.LossNotHeld)), 1)
	if err := lk.Release(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Release: %v", err)
	}
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
}

// Attack that held: many concurrent calls sharing the Observer as Locker
// and call observer of different Lockers, releases racing losses: the
// gauges come back to 0 and never go negative; raw keys never become
// label values.
func TestRedTeam15_GaugesUnderRaces(t *testing.T) {
	reg, obs := newObs(t)
	ml := memlock.New(dlock.WithObserver(obs))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			key := "secret-key-" + strings.Repeat("x", i*60)
			for range 5 {
				lk, err := ml.Acquire(ctx, key, dlock.WithTTL(dlock.MinTTL))
				if err != nil {
					t.Error(err)
					return
				}
				var in sync.WaitGroup
				in.Go(func() { ml.Expire(key) })
				in.Go(func() { _ = lk.Release(ctx) })
				in.Wait()
				<-lk.Lost()
			}
		})
	}
	wg.Wait()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if value(t, reg, "dlock_locks_held", mem) == 0 {
			break
		}
	}
	expect(t, reg, "dlock_locks_held", mem, 0)
	expect(t, reg, "dlock_waiters", mem, 0)
	for _, name := range []string{"dlock_locks_held", "dlock_waiters", "dlock_acquire_total", "dlock_lost_total", "dlock_renew_total", "dlock_hold_duration_seconds"} {
		for _, s := range scrape(t, reg, name) {
			if s.value < 0 {
				t.Errorf("%s%v = %v", name, s.labels, s.value)
			}
			for k, v := range s.labels {
				if strings.Contains(v, "secret") {
					t.Errorf("%s: label %s carries the key: %q", name, k, v)
				}
			}
		}
	}
}

// Red team (issue 15): the dashboard's "Fencing rejections" stat summed
// increase() over the range, which never sees a series' first increment
// (client_golang creates a labelled counter at its first Inc): a process's
// first stale write showed as 0. The panel's own query, with its
// variables filled in, is run by promtool on such a series.
func TestRedTeam15_DashboardCountsFirstRejection(t *testing.T) {
	bin := promtool(t)
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	expr := ""
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Title == "Fencing rejections" && len(p.Targets) == 1 {
				expr = p.Targets[0].Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if expr == "" {
		t.Fatal(`no "Fencing rejections" panel with one query`)
	}
	expr = strings.NewReplacer("$backend", ".*", "$key_class", ".*", "$__range", "1h").Replace(expr)
	// One series rejecting for years (flat over the hour) and one born at
	// its first rejection 20 minutes before the evaluation: 1 rejection.
	test := `rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'dlock_fencing_rejected_total{backend="redis",key_class="old"}'
        values: '5x90'
      - series: 'dlock_fencing_rejected_total{backend="redis",key_class="new"}'
        values: '_x69 1x20'
    promql_expr_test:
      - expr: '` + expr + `'
        eval_time: 90m
        exp_samples:
          - labels: '{}'
            value: 1
`
	f := filepath.Join(t.TempDir(), "dashboard_test.yml")
	if err := os.WriteFile(f, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "test", "rules", f).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool on the panel's query %s: %v\n%s", expr, err, out)
	}
}
