package dlockprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/memlock"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v2"
)

// promtool returns the path of promtool, or ends the test: a failure in
// CI (where `make deps` installs it), a skip elsewhere.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("promtool not found (%v): run `make deps` (Debian package prometheus)", err)
	}
	t.Skipf("promtool not found (%v): `make deps` installs it; skipped outside CI", err)
	return ""
}

// The shipped rules load, and their unit tests (alerts_test.yml: which
// alerts fire on which series) pass.
func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// exported is what a scrape of a registry shows after a scripted run on
// memlock: exposition names (a histogram's _bucket, _sum and _count),
// label names and, per label, the values seen.
type exported struct {
	names  map[string]bool
	labels map[string]map[string]bool
}

func exercised(t *testing.T) exported {
	t.Helper()
	reg, obs := newObs(t)
	l := memlock.New(dlock.WithObserver(obs))
	g := guard.NewMemory(dlock.WithObserver(obs))
	ctx := context.Background()

	// acquired, renewed, contended, timed out, refused (error), released.
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held key: %v", err)
	}
	if _, err := l.Acquire(ctx, "k", dlock.WithWait(20*time.Millisecond)); err == nil {
		t.Fatal("Acquire on a held key succeeded")
	}
	if _, err := l.TryAcquire(ctx, ""); err == nil {
		t.Fatal("TryAcquire of an empty key succeeded")
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Lost (the lease deleted), then a stale fence refused by a guard.
	first, err := l.Acquire(ctx, "account", dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	l.Expire("account")
	<-first.Lost()
	waitFor(t, reg, "dlock_lost_total", with("reason", string(dlock.LossNotHeld)), 1)
	second, err := l.Acquire(ctx, "account")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "account", second.Fence(), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := g.Do(ctx, "account", first.Fence(), func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrStaleToken) {
		t.Fatalf("stale write: %v", err)
	}
	_ = first.Release(ctx)
	_ = second.Release(ctx)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ex := exported{names: map[string]bool{}, labels: map[string]map[string]bool{}}
	for _, mf := range mfs {
		n := mf.GetName()
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			ex.names[n+"_bucket"], ex.names[n+"_sum"], ex.names[n+"_count"] = true, true, true
			ex.labels["le"] = map[string]bool{}
		} else {
			ex.names[n] = true
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if ex.labels[lp.GetName()] == nil {
					ex.labels[lp.GetName()] = map[string]bool{}
				}
				ex.labels[lp.GetName()][lp.GetValue()] = true
			}
		}
	}
	for _, want := range []string{"dlock_acquire_duration_seconds_bucket", "dlock_acquire_total", "dlock_hold_duration_seconds_bucket", "dlock_locks_held", "dlock_waiters", "dlock_renew_total", "dlock_lost_total", "dlock_fencing_rejected_total"} {
		if !ex.names[want] {
			t.Fatalf("the scripted run did not export %s", want)
		}
	}
	return ex
}

var (
	metricName = regexp.MustCompile(`\bdlock_[a-z_]+`)
	selector   = regexp.MustCompile(`\{([^{}]*)\}`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	grouping   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
)

// reporter is the part of *testing.T checkExpr uses.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// failures records checkExpr's reports (TestCheckExprCatches).
type failures struct{ n int }

func (f *failures) Helper()               {}
func (f *failures) Errorf(string, ...any) { f.n++ }

// checkExpr reports every metric name, label name, and literal value of
// a label matcher in expr that the scrape does not show. Values with a
// Grafana variable ($backend) are not checked.
func (ex exported) checkExpr(t reporter, where, expr string) {
	t.Helper()
	for _, n := range metricName.FindAllString(expr, -1) {
		if !ex.names[n] {
			t.Errorf("%s: metric %s is not exported by dlockprom: %s", where, n, expr)
		}
	}
	for _, sel := range selector.FindAllStringSubmatch(expr, -1) {
		for _, m := range matcher.FindAllStringSubmatch(sel[1], -1) {
			name, op, val := m[1], m[2], m[3]
			if name == "__name__" {
				continue
			}
			vals, ok := ex.labels[name]
			if !ok {
				t.Errorf("%s: label %s is not exported by dlockprom: %s", where, name, expr)
				continue
			}
			if strings.Contains(val, "$") || name == "le" || name == "backend" || name == "key_class" || op == "!=" || op == "!~" {
				continue // user values (backend names, key classes) are open sets
			}
			for _, v := range strings.Split(val, "|") {
				if !vals[v] {
					t.Errorf("%s: %s=%q is never exported (seen %v): %s", where, name, v, keys(vals), expr)
				}
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && ex.labels[l] == nil {
				t.Errorf("%s: label %s (grouping) is not exported by dlockprom: %s", where, l, expr)
			}
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// Every alert's expression uses only names dlockprom exports, and every
// alert has a for:, a severity and a summary and description.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	ex := exercised(t)
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(b, &rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				if !strings.HasPrefix(r.Record, "dlock:") {
					t.Errorf("recording rule %s: not in the dlock: namespace", r.Record)
				}
				continue
			}
			alerts[r.Alert] = true
			ex.checkExpr(t, "alerts.yml "+r.Alert, r.Expr)
			if r.For == "" {
				t.Errorf("alert %s has no for:", r.Alert)
			}
			switch r.Labels["severity"] {
			case "warning", "critical":
			default:
				t.Errorf("alert %s: severity %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s lacks a summary or description", r.Alert)
			}
		}
	}
	for _, want := range []string{"DlockAcquireSlow", "DlockContentionHigh", "DlockRenewalsFailing", "DlockAcquireTimeouts", "DlockFencingRejected", "DlockLockLost"} {
		if !alerts[want] {
			t.Errorf("alerts.yml lacks %s", want)
		}
	}
}

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

// The dashboard parses, has the variables and panels it promises, every
// panel queries the templated datasource with exported names only, and
// panel ids are unique.
func TestDashboard(t *testing.T) {
	ex := exercised(t)
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.SchemaVersion < 36 || d.UID == "" || d.Title == "" {
		t.Errorf("schemaVersion %d, uid %q, title %q", d.SchemaVersion, d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" {
			// The query is a string (older Grafana) or an object with one.
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				if err := json.Unmarshal(v.Query, &q); err != nil {
					t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
				}
			}
			if !strings.Contains(q.Query, "dlock_") {
				t.Errorf("variable %s: query %q names no dlock metric", v.Name, q.Query)
			}
			ex.checkExpr(t, "variable "+v.Name, q.Query)
		}
	}
	if vars["datasource"] != "datasource" || vars["backend"] != "query" || vars["key_class"] != "query" {
		t.Errorf("variables %v: want datasource (datasource), backend and key_class (query)", vars)
	}
	var all []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	ids := map[int]string{}
	titles := map[string]bool{}
	for _, p := range all {
		if prev, dup := ids[p.ID]; dup || p.ID <= 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: a target without expr", p.Title)
				continue
			}
			if !strings.Contains(tg.Expr, `backend=~"$backend"`) || !strings.Contains(tg.Expr, `key_class=~"$key_class"`) {
				t.Errorf("panel %q: %s does not filter by $backend and $key_class", p.Title, tg.Expr)
			}
			ex.checkExpr(t, "panel "+p.Title, tg.Expr)
		}
	}
	for _, want := range []string{"Contention by key class", "Acquire latency p50 / p99", "Hold time p50 / p99", "Hold time distribution", "Locks held", "Waiters", "Locks lost by reason", "Fencing rejections", "Renewals failed"} {
		if !titles[want] {
			t.Errorf("dashboard lacks the panel %q (has %v)", want, keys(titles))
		}
	}
}

// The checker itself catches a misspelt metric, an unknown label and a
// value never exported.
func TestCheckExprCatches(t *testing.T) {
	ex := exported{
		names:  map[string]bool{"dlock_acquire_total": true},
		labels: map[string]map[string]bool{"result": {"acquired": true}, "backend": {"memory": true}},
	}
	for _, bad := range []string{
		`rate(dlock_acquire_totl[5m])`,
		`dlock_acquire_total{reslt="acquired"}`,
		`dlock_acquire_total{result=~"acquired|contendd"}`,
		`sum by (instance_class) (dlock_acquire_total)`,
	} {
		var f failures
		ex.checkExpr(&f, "test", bad)
		if f.n == 0 {
			t.Errorf("checkExpr accepted %s", bad)
		}
	}
	ex.checkExpr(t, "good", `sum by (backend) (rate(dlock_acquire_total{result="acquired",backend=~"$backend"}[5m]))`)
}

// The fencing-rejections stat showed "No data", not 0, on a healthy fleet
// (no guard ever refused, so the counter series does not exist): its
// query, evaluated by promtool with the dashboard's variables matching
// everything, is 0 without the series and counts a rejection with it.
func TestDashboard_FencingRejectionsStatIsZeroWithoutRejections(t *testing.T) {
	bin := promtool(t)
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var expr string
	for _, p := range d.Panels {
		if p.Title == "Fencing rejections" && len(p.Targets) == 1 {
			expr = p.Targets[0].Expr
		}
	}
	if expr == "" {
		t.Fatal(`dashboard.json has no "Fencing rejections" panel with one query`)
	}
	expr = strings.NewReplacer(`"$backend"`, `".*"`, `"$key_class"`, `".*"`, "$__range", "1h").Replace(expr)
	q, _ := json.Marshal(expr) // a JSON string is a valid YAML scalar
	test := `rule_files: []
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'dlock_acquire_total{backend="redis",key_class="job",result="acquired"}'
        values: '0+10x90'
    promql_expr_test:
      - expr: ` + string(q) + `
        eval_time: 80m
        exp_samples:
          - labels: '{}'
            value: 0
  - interval: 1m
    input_series:
      - series: 'dlock_fencing_rejected_total{backend="redis",key_class="job"}'
        values: '_x70 1x20'
    promql_expr_test:
      - expr: ` + string(q) + `
        eval_time: 80m
        exp_samples:
          - labels: '{}'
            value: 1
`
	f := t.TempDir() + "/stat_test.yml"
	if err := os.WriteFile(f, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "test", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules (the stat's query %s): %v\n%s", expr, err, out)
	}
}

// Symptom: after a scrape gap every old nonzero fencing/lost total fired again.
// Edge series for alerts.yml, as promtool unit tests
// (alerts_edge_test.yml): scrape gaps, no traffic (NaN ratios), counter
// resets and restarts neither fire falsely nor hide an event.
func TestAlertRules_EdgeSeriesNeitherFireFalselyNorHideEvents(t *testing.T) {
	bin := promtool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "test", "rules", "alerts_edge_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules alerts_edge_test.yml: %v\n%s", err, out)
	}
}

// Symptom: the dashboard's "Fencing rejections" stat showed a process's first stale write as 0.
// increase() over the range never sees a series' first increment
// (client_golang creates a labelled counter at its first Inc), so the
// stat must count it otherwise. The panel's own query, with its variables
// filled in, is run by promtool on such a series.
func TestDashboard_FencingRejectionsStatCountsFirstRejection(t *testing.T) {
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
