package sluiceprometheus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/metrics/sluiceprometheus"
)

// dashboardPath is the Grafana dashboard shipped for this adapter's
// metrics. Nothing else ties its queries to the names the Collector
// exports, so this test does.
const dashboardPath = "../../docs/grafana/sluice.json"

// TestDashboard: every series the dashboard's queries read is one the
// Collector exports, under labels it carries; every family the Collector
// exported here has a panel; and the check fails on a copy of the
// dashboard broken in each way it looks for.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	fams := exportedFamilies(t)
	used, problems := checkDashboard(raw, fams)
	for _, p := range problems {
		t.Error(p)
	}
	for name := range fams {
		if !used[name] {
			t.Errorf("%s is exported but no panel of %s reads it", name, dashboardPath)
		}
	}

	for _, c := range []struct{ name, old, new, want string }{
		{"unknown metric", `rate(sluice_reentries_total{`, `rate(sluice_bogus_total{`, `"sluice_bogus_total"`},
		{"unknown filter label", `sluice_result=\"granted\"`, `sluice_outcome=\"granted\"`, `no label "sluice_outcome"`},
		{"unknown grouping label", `sluice_result, sluice_reason)`, `sluice_result, sluice_cause)`, `no label "sluice_cause"`},
		{"histogram without a suffix", `rate(sluice_request_lateness_seconds_count{`, `rate(sluice_request_lateness_seconds{`, `"sluice_request_lateness_seconds" is a histogram`},
		{"le on a _count", `le) (rate(sluice_request_lateness_seconds_bucket{`, `le) (rate(sluice_request_lateness_seconds_count{`, `no label "le"`},
		{"unknown legend label", `{{sluice_reason}}`, `{{sluice_reasn}}`, `no label "sluice_reasn"`},
		{"variable on an unknown label", `label_values(sluice_requests_total, sluice_limiter_kind)`, `label_values(sluice_requests_total, sluice_limiter)`, `no label "sluice_limiter"`},
		{"variable on an unknown metric", `label_values(sluice_requests_total{`, `label_values(sluice_request_total{`, `"sluice_request_total"`},
		{"panel ignores a variable", `(sluice_held_permits{sluice_limiter_kind=~\"$kind\", `, `(sluice_held_permits{`, `not filtered by sluice_limiter_kind=~"$kind"`},
		{"unbalanced expression", `(sluice_queued_requests{`, `((sluice_queued_requests{`, `unbalanced`},
		{"not JSON", `"panels": [`, `"panels": [,`, `not JSON`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !bytes.Contains(raw, []byte(c.old)) {
				t.Fatalf("%s no longer has %s: break another line", dashboardPath, c.old)
			}
			_, problems := checkDashboard(bytes.ReplaceAll(raw, []byte(c.old), []byte(c.new)), fams)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("no problem says %s; the check reported %q", c.want, problems)
			}
		})
	}
}

// exportedFamilies gathers a real Collector that has seen each kind of
// event, tracks a limiter with every Stats figure above 0 and reads a
// real bucket from Redis, so that every family it can export is there.
func exportedFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	c := sluiceprometheus.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	var o sluice.Observer = c
	for _, e := range []sluice.Event{
		{Limiter: "local.rate", Result: sluice.Granted, Queued: true, Wait: 30 * time.Millisecond, Late: 2 * time.Millisecond},
		{Limiter: "local.rate", Result: sluice.Refused, Reason: "wait_too_long"},
		{Limiter: "local.rate", Result: sluice.Canceled, Queued: true, Wait: time.Second},
		{Limiter: "local.rate", Result: sluice.Failed, Reason: "closed"},
		{Limiter: "bucket", Result: sluice.Granted, Wait: time.Second, Shadow: true},
	} {
		o.Observe(e)
	}
	stop := c.Track("semaphore", "db", statsFunc(func() sluice.Stats {
		return sluice.Stats{Waiting: 1, Held: 2, Reentries: 3, Steps: 4, Fenced: 5, Errors: 6, LeasesLost: 7, Local: true, LocalGranted: 8}
	}))
	t.Cleanup(stop)

	srv := redistest.New(t)
	b := newBucket(t, srv, bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxWait: time.Second, Observer: c})
	t.Cleanup(c.TrackQueue(b))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Enter(ctx); !errors.Is(err, sluice.ErrWaitTooLong) {
		t.Fatalf("Enter on an empty bucket = %v, want ErrWaitTooLong", err)
	}
	// A bucket with callers held in a named lane and the default one, for
	// the lanes' figures.
	lb := newBucket(t, srv, bucket.Config{Name: t.Name() + "-lanes", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, Observer: c})
	t.Cleanup(c.TrackQueue(lb))
	if err := lb.Enter(bucket.WithLane(ctx, "tenant-1")); err != nil {
		t.Fatal(err)
	}
	buckettest.Queue(t, lb, map[string]int{"tenant-1": 1, "": 1})

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		fams[mf.GetName()] = mf
	}
	return fams
}

// The parts of a Grafana dashboard the check reads.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": ...}
	Datasource *datasourceRef  `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []struct {
		RefID        string         `json:"refId"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
		Datasource   *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// The variables every query must filter by, so that picking a limiter
// narrows every panel.
var dashboardFilters = []promMatcher{
	{label: "sluice_limiter_kind", op: "=~", value: "$kind"},
	{label: "sluice_limiter_name", op: "=~", value: "$name"},
}

var (
	labelValuesRE = regexp.MustCompile(`^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)
	legendLabelRE = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

// checkDashboard checks raw, a dashboard's JSON, against the families a
// registry gathered. It returns the families the dashboard reads and
// what is wrong, one line each.
func checkDashboard(raw []byte, fams map[string]*dto.MetricFamily) (used map[string]bool, problems []string) {
	used = map[string]bool{}
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return used, []string{"not JSON: " + err.Error()}
	}
	if d.Title == "" || d.UID == "" {
		report("title %q and uid %q: want both", d.Title, d.UID)
	}
	if d.SchemaVersion < 36 {
		report("schemaVersion %d: want 36 or later (Grafana 9 and later)", d.SchemaVersion)
	}
	// readSelectors checks what one query reads and returns the families.
	readSelectors := func(where, expr string, filtered bool) []string {
		sels, err := promSelectors(expr)
		if err != nil {
			report("%s: %v", where, err)
			return nil
		}
		if len(sels) == 0 {
			report("%s: reads no metric", where)
		}
		var read []string
		for _, s := range sels {
			fam, labels, problem := resolveSeries(s.metric, fams)
			if problem != "" {
				report("%s: %q %s", where, s.metric, problem)
				continue
			}
			used[fam] = true
			read = append(read, fam)
			for _, m := range s.matchers {
				if !labels[m.label] {
					report("%s: %q has no label %q to filter by", where, s.metric, m.label)
				}
			}
			for _, l := range s.grouped {
				if !labels[l] {
					report("%s: %q has no label %q to group by", where, s.metric, l)
				}
			}
			if !filtered {
				continue
			}
			for _, f := range dashboardFilters {
				if !slices.Contains(s.matchers, f) {
					report("%s: %q is not filtered by %s%s%q", where, s.metric, f.label, f.op, f.value)
				}
			}
		}
		return read
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		report("variable datasource: type %q query %s, want a Prometheus data source variable", v.Type, v.Query)
	}
	for name, label := range map[string]string{"kind": "sluice_limiter_kind", "name": "sluice_limiter_name"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			report("variable %s: missing, or not a query", name)
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			report("variable %s: data source %v, want ${datasource}", name, v.Datasource)
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var obj struct {
				Query string `json:"query"`
			}
			json.Unmarshal(v.Query, &obj)
			q = obj.Query
		}
		m := labelValuesRE.FindStringSubmatch(q)
		if m == nil || m[2] != label {
			report("variable %s: query %q, want label_values(<metric>, %s)", name, q, label)
		}
		if m == nil {
			continue
		}
		for _, fam := range readSelectors("variable "+name, m[1], false) {
			if !familyLabels(fams[fam])[m[2]] {
				report("variable %s: %q has no label %q", name, fam, m[2])
			}
		}
	}

	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				report("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				report("panel %q: no query", p.Title)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				report("panel %q: data source %v, want ${datasource}", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				where := fmt.Sprintf("panel %q query %s", p.Title, tg.RefID)
				if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
					report("%s: data source %v, want ${datasource}", where, tg.Datasource)
				}
				read := readSelectors(where, tg.Expr, true)
				for _, m := range legendLabelRE.FindAllStringSubmatch(tg.LegendFormat, -1) {
					for _, fam := range read {
						if !familyLabels(fams[fam])[m[1]] {
							report("%s: legend: %q has no label %q", where, fam, m[1])
						}
					}
				}
			}
		}
	}
	if len(d.Panels) == 0 {
		report("no panels")
	}
	walk(d.Panels)
	return used, problems
}

// resolveSeries finds the family a series name belongs to: the name
// itself, or a histogram's family under its _bucket, _sum or _count
// series (le only on _bucket). A name that is a family is never cut, so
// a counter named x_count would stay whole.
func resolveSeries(name string, fams map[string]*dto.MetricFamily) (family string, labels map[string]bool, problem string) {
	if mf, ok := fams[name]; ok {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			return "", nil, "is a histogram: read its _bucket, _sum or _count series"
		}
		return name, familyLabels(mf), ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if mf := fams[base]; ok && mf.GetType() == dto.MetricType_HISTOGRAM {
			labels := familyLabels(mf)
			if suffix == "_bucket" {
				labels["le"] = true
			}
			return base, labels, ""
		}
	}
	return "", nil, "is not a series sluiceprometheus exports"
}

func familyLabels(mf *dto.MetricFamily) map[string]bool {
	labels := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = true
		}
	}
	return labels
}

// promSelector is one vector selector of a PromQL expression: the series
// it names, its label matchers, and the labels of the by, without, on,
// ignoring and group_ clauses that apply to it.
type promSelector struct {
	metric   string
	matchers []promMatcher
	grouped  []string
	pos      int // its token, to place it inside a clause's parentheses
}

type promMatcher struct{ label, op, value string }

// promToken is one token of a PromQL expression with Grafana's
// variables: 'i' an identifier, 's' a string (unquoted), 'n' a number or
// a duration, 'v' a Grafana variable, 'o' a comparison or matcher
// operator, 'p' any other character.
type promToken struct {
	kind byte
	text string
}

var (
	// groupingKeywords take a parenthesised list of label names.
	groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	// promKeywords are identifiers that name no series.
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true}
)

// promSelectors returns the selectors of expr. It knows as much PromQL
// as a dashboard needs, not all of it: enough to tell a metric from a
// function, a keyword or a label name.
func promSelectors(expr string) ([]promSelector, error) {
	toks, err := promLex(expr)
	if err != nil {
		return nil, err
	}
	is := func(i int, text string) bool {
		return i >= 0 && i < len(toks) && toks[i].kind == 'p' && toks[i].text == text
	}
	match := make([]int, len(toks)) // each parenthesis's partner
	var open []int
	for i := range toks {
		switch {
		case is(i, "("):
			open = append(open, i)
		case is(i, ")"):
			if len(open) == 0 {
				return nil, fmt.Errorf("unbalanced ) in %s", expr)
			}
			match[i], match[open[len(open)-1]] = open[len(open)-1], i
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		return nil, fmt.Errorf("unbalanced ( in %s", expr)
	}

	type clause struct {
		from, to int // the tokens it applies to
		labels   []string
	}
	var sels []promSelector
	var clauses []clause
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch {
		case tk.kind == 'i' && groupingKeywords[tk.text]:
			if !is(i+1, "(") {
				if tk.text == "group_left" || tk.text == "group_right" {
					continue // their label list is optional
				}
				return nil, fmt.Errorf("%s without a label list in %s", tk.text, expr)
			}
			end := match[i+1]
			c := clause{from: 0, to: len(toks)} // on, ignoring, group_*: both sides
			for _, l := range toks[i+2 : end] {
				switch {
				case l.kind == 'i':
					c.labels = append(c.labels, l.text)
				case l.kind != 'p' || l.text != ",":
					return nil, fmt.Errorf("%q in the labels of %s in %s", l.text, tk.text, expr)
				}
			}
			if tk.text == "by" || tk.text == "without" {
				// sum by (l) (x), or sum (x) by (l).
				switch {
				case is(end+1, "("):
					c.from, c.to = end+1, match[end+1]
				case is(i-1, ")"):
					c.from, c.to = match[i-1], i-1
				default:
					return nil, fmt.Errorf("%s applies to nothing in %s", tk.text, expr)
				}
			}
			clauses = append(clauses, c)
			i = end
		case tk.kind == 'i' && promKeywords[tk.text]:
		case tk.kind == 'i' && (is(i+1, "(") || i+1 < len(toks) && (toks[i+1].text == "by" || toks[i+1].text == "without")):
			// a function, or an aggregation (sum by (l) (x))
		case tk.kind == 'i' || is(i, "{"):
			s := promSelector{pos: i}
			if tk.kind == 'i' {
				s.metric = tk.text
				i++
			}
			if is(i, "{") {
				ms, end, err := promMatchers(toks, i)
				if err != nil {
					return nil, fmt.Errorf("%v in %s", err, expr)
				}
				s.matchers = ms
				i = end
			} else {
				i--
			}
			if s.metric == "" {
				for _, m := range s.matchers {
					if m.label == "__name__" && m.op == "=" {
						s.metric = m.value
					}
				}
			}
			if s.metric == "" {
				return nil, fmt.Errorf("a selector without a metric name in %s", expr)
			}
			sels = append(sels, s)
		case is(i, "}"):
			return nil, fmt.Errorf("unbalanced } in %s", expr)
		}
	}
	for _, c := range clauses {
		for i := range sels {
			if c.from <= sels[i].pos && sels[i].pos <= c.to {
				sels[i].grouped = append(sels[i].grouped, c.labels...)
			}
		}
	}
	return sels, nil
}

// promMatchers reads the matchers between toks[open], a {, and its }.
func promMatchers(toks []promToken, open int) ([]promMatcher, int, error) {
	var ms []promMatcher
	for i := open + 1; i < len(toks); {
		if toks[i].kind == 'p' && toks[i].text == "}" {
			return ms, i, nil
		}
		if i+2 >= len(toks) || toks[i].kind != 'i' || toks[i+1].kind != 'o' || toks[i+2].kind != 's' ||
			!slices.Contains([]string{"=", "!=", "=~", "!~"}, toks[i+1].text) {
			return nil, 0, fmt.Errorf("a matcher that is not label op \"value\" at %q", toks[i].text)
		}
		ms = append(ms, promMatcher{label: toks[i].text, op: toks[i+1].text, value: toks[i+2].text})
		i += 3
		if i < len(toks) && toks[i].kind == 'p' && toks[i].text == "," {
			i++
		}
	}
	return nil, 0, errors.New("unbalanced {")
}

// promLex splits expr into tokens. Ranges and subqueries ([5m],
// [$__rate_interval], [1h:1m]) hold durations only, so they are dropped.
func promLex(expr string) ([]promToken, error) {
	identStart := func(c byte) bool { return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	identChar := func(c byte) bool { return identStart(c) || '0' <= c && c <= '9' }
	var toks []promToken
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case strings.IndexByte(" \t\r\n", c) >= 0:
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string in %s", expr)
			}
			toks = append(toks, promToken{'s', expr[i+1 : j]})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unbalanced [ in %s", expr)
			}
			i += j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ in %s", expr)
				}
				j += k + 1
			} else {
				for j < len(expr) && identChar(expr[j]) {
					j++
				}
			}
			toks = append(toks, promToken{'v', expr[i:j]})
			i = j
		case identStart(c):
			j := i + 1
			for j < len(expr) && identChar(expr[j]) {
				j++
			}
			toks = append(toks, promToken{'i', expr[i:j]})
			i = j
		case '0' <= c && c <= '9' || c == '.':
			j := i + 1
			for j < len(expr) && (identChar(expr[j]) || expr[j] == '.') {
				j++
			}
			toks = append(toks, promToken{'n', expr[i:j]})
			i = j
		case strings.IndexByte("=!~<>", c) >= 0:
			j := i + 1
			for j < len(expr) && strings.IndexByte("=!~<>", expr[j]) >= 0 {
				j++
			}
			toks = append(toks, promToken{'o', expr[i:j]})
			i = j
		default:
			toks = append(toks, promToken{'p', expr[i : i+1]})
			i++
		}
	}
	return toks, nil
}

// TestPromSelectors: the metrics and labels an expression reads, and
// none of its functions, keywords, label names, strings or variables.
func TestPromSelectors(t *testing.T) {
	type sel struct {
		metric  string
		labels  string // matchers' labels, then grouped labels
		grouped string
	}
	for _, c := range []struct {
		expr string
		want []sel
	}{
		{`up`, []sel{{"up", "", ""}}},
		{`sum by (a, b) (rate(m_total{x="1", y=~"$v"}[$__rate_interval]))`, []sel{{"m_total", "x y", "a b"}}},
		{`histogram_quantile(0.9, sum(rate(h_bucket{k="v"}[5m])) by (le))`, []sel{{"h_bucket", "k", "le"}}},
		{`sum by (a) (x) / sum(y)`, []sel{{"x", "", "a"}, {"y", "", ""}}},
		{`x / on(a) group_left(b) y{c!="d"}`, []sel{{"x", "", "a b"}, {"y", "c", "a b"}}},
		{`x and bool y offset 5m or z unless w`, []sel{{"x", "", ""}, {"y", "", ""}, {"z", "", ""}, {"w", "", ""}}},
		{`{__name__="m", a="b"}`, []sel{{"m", "__name__ a", ""}}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []sel{{"m", "", ""}}},
		{`max_over_time(rate(m[1h:5m] offset 1h)[1d:]) > 0.5 * inf`, []sel{{"m", "", ""}}},
		{`count_values("v", sum without (i) (m{a="}"}))`, []sel{{"m", "a", "i"}}},
		{`sum(x{a="1"} # the first
		) by (b)`, []sel{{"x", "a", "b"}}},
		{"count_values(`v`, m) + 1e3", []sel{{"m", "", ""}}},
	} {
		got, err := promSelectors(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		var gs []sel
		for _, s := range got {
			var ls []string
			for _, m := range s.matchers {
				ls = append(ls, m.label)
			}
			gs = append(gs, sel{s.metric, strings.Join(ls, " "), strings.Join(s.grouped, " ")})
		}
		if !slices.Equal(gs, c.want) {
			t.Errorf("%s: %v, want %v", c.expr, gs, c.want)
		}
	}
	for _, expr := range []string{`sum(x`, `x)`, `x{a="b"`, `x{a}`, `sum by x`, `x{a="b"}}`, `{a="b"}`, `x{a="b`} {
		if _, err := promSelectors(expr); err == nil {
			t.Errorf("%s: no error", expr)
		}
	}
}
