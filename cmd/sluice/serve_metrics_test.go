package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// exposition is one scrape of /metrics, parsed: each sample's value by
// its series ("name{label="value",...}", as written), and each family's
// # HELP and # TYPE.
type exposition struct {
	samples     map[string]float64
	help, types map[string]string
	raw         string
}

var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// scrape GETs /metrics and parses it, failing t on any line that is not
// the text format, or a sample of a family with no # TYPE before it.
func scrape(t *testing.T, base string, headers ...string) exposition {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, raw)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q, want Prometheus's text format 0.0.4", ct)
	}
	e := exposition{samples: map[string]float64{}, help: map[string]string{}, types: map[string]string{}, raw: string(raw)}
	lines := bufio.NewScanner(strings.NewReader(e.raw))
	for lines.Scan() {
		l := lines.Text()
		if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
			name, help, _ := strings.Cut(rest, " ")
			e.help[name] = help
			continue
		}
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			if _, dup := e.types[name]; dup {
				t.Errorf("# TYPE %s twice", name)
			}
			e.types[name] = typ
			continue
		}
		m := sampleLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("not a line of the text format: %q\n%s", l, raw)
		}
		family := m[1]
		if e.types[family] == "" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if f, ok := strings.CutSuffix(family, suffix); ok && e.types[f] == "histogram" {
					family = f
				}
			}
		}
		if e.types[family] == "" || e.help[family] == "" {
			t.Errorf("sample %q with no # TYPE and # HELP before it", l)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Errorf("sample %q: value: %v", l, err)
		}
		if _, dup := e.samples[m[1]+m[2]]; dup {
			t.Errorf("sample %q twice", l)
		}
		e.samples[m[1]+m[2]] = v
	}
	return e
}

// value is the sample of family name whose labels are exactly labels
// ("k", "v", ... in any order), and whether there is one.
func (e exposition) value(name string, labels ...string) (float64, bool) {
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for series, v := range e.samples {
		n, ls, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		got := labelPair.FindAllStringSubmatch(ls, -1)
		if len(got) != len(want) {
			continue
		}
		for _, p := range got {
			if want[p[1]] != strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\n`, "\n").Replace(p[2]) {
				continue next
			}
		}
		return v, true
	}
	return 0, false
}

// TestServeMetrics: /metrics is Prometheus's text format, with the names
// and labels of metrics/sluiceprometheus: a grant counts in
// sluice_requests_total, a refusal under its reason, a permit in the
// permits held; the histograms' counts agree with their buckets; with
// --token-file it wants the token, as the API does.
func TestServeMetrics(t *testing.T) {
	redisURL, _ := server(t)
	name := `metrics "a"\b` // a name the label escaping must keep
	sem := "metrics-sem"
	cfg := writeConfig(t, fmt.Sprintf(`{"buckets": {%q: {"policies": ["rate=1/1h,burst=2"]}}, "semaphores": {%q: {"capacity": 2}}}`, name, sem))
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sr := startServe(t, "--redis", redisURL, "--config", cfg, "--token-file", tokenFile)
	auth := "Authorization: Bearer s3cret"
	ctx := context.Background()
	u := sr.base + "/v1/buckets/" + url.PathEscape(name)

	call(t, ctx, "GET", sr.base+"/metrics", ``).want(t, "/metrics without the token", 401, "bearer token")

	bucketLabels := []string{"sluice_limiter_kind", "bucket", "sluice_limiter_name", name}
	granted := append(bucketLabels, "sluice_result", "granted", "sluice_reason", "")
	before := scrape(t, sr.base, auth)
	if q, ok := before.value("sluice_queued_requests", bucketLabels...); !ok || q != 0 {
		t.Errorf("sluice_queued_requests of the configured bucket before any call: %v (present %v), want 0\n%s", q, ok, before.raw)
	}
	if typ := before.types["sluice_queued_requests"]; typ != "gauge" {
		t.Errorf("# TYPE sluice_queued_requests %q, want gauge", typ)
	}
	if n, ok := before.value("sluice_requests_total", granted...); ok {
		t.Errorf("sluice_requests_total of grants before any call: %v, want none", n)
	}

	call(t, ctx, "POST", u+"/enter", ``, auth).want(t, "enter", 200)
	call(t, ctx, "POST", u+"/enter", ``, auth).want(t, "enter", 200)
	call(t, ctx, "POST", u+"/enter", `{"timeout_ms": 100}`, auth).want(t, "enter past its timeout", 429)
	p := call(t, ctx, "POST", sr.base+"/v1/semaphores/"+sem+"/acquire", ``, auth).want(t, "acquire", 200)

	after := scrape(t, sr.base, auth)
	if typ := after.types["sluice_requests_total"]; typ != "counter" {
		t.Errorf("# TYPE sluice_requests_total %q, want counter", typ)
	}
	if help := after.help["sluice_requests_total"]; !strings.Contains(help, "Calls that tried to enter") {
		t.Errorf("# HELP sluice_requests_total %q, want the adapter's", help)
	}
	if n, _ := after.value("sluice_requests_total", granted...); n != 2 {
		t.Errorf("sluice_requests_total of grants after 2 enters: %v, want 2\n%s", n, after.raw)
	}
	refused := append(bucketLabels, "sluice_result", "refused", "sluice_reason", "wait_too_long")
	if n, _ := after.value("sluice_requests_total", refused...); n != 1 {
		t.Errorf("sluice_requests_total of wait_too_long refusals: %v, want 1\n%s", n, after.raw)
	}
	semLabels := []string{"sluice_limiter_kind", "semaphore", "sluice_limiter_name", sem}
	if n, _ := after.value("sluice_held_permits", semLabels...); n != 1 {
		t.Errorf("sluice_held_permits of the semaphore holding one permit: %v, want 1\n%s", n, after.raw)
	}
	// Each histogram: buckets cumulative, the +Inf one its count.
	for _, h := range []struct {
		name   string
		labels []string
	}{
		{"sluice_request_time_in_queue_seconds", append(bucketLabels, "sluice_result", "granted")},
		{"sluice_request_lateness_seconds", bucketLabels},
	} {
		if typ := after.types[h.name]; typ != "histogram" {
			t.Errorf("# TYPE %s %q, want histogram", h.name, typ)
		}
		count, ok := after.value(h.name+"_count", h.labels...)
		inf, _ := after.value(h.name+"_bucket", append(h.labels, "le", "+Inf")...)
		if _, hasSum := after.value(h.name+"_sum", h.labels...); !ok || !hasSum || count != inf {
			t.Errorf("%s%v: count %v (present %v), +Inf bucket %v, sum present %v; want a count equal to the +Inf bucket\n%s", h.name, h.labels, count, ok, inf, hasSum, after.raw)
		}
		if n, _ := after.value(h.name+"_bucket", append(h.labels, "le", "0.01")...); n > inf {
			t.Errorf("%s: bucket le=0.01 %v above +Inf's %v", h.name, n, inf)
		}
	}

	call(t, ctx, "POST", sr.base+"/v1/semaphores/"+sem+"/release", `{"permit": "`+p.str("permit")+`"}`, auth).want(t, "release", 200)
	last := scrape(t, sr.base, auth)
	if n, ok := last.value("sluice_held_permits", semLabels...); !ok || n != 0 {
		t.Errorf("sluice_held_permits after the release: %v (present %v), want 0, still reported", n, ok)
	}
	if n, _ := last.value("sluice_requests_total", append(semLabels, "sluice_result", "granted", "sluice_reason", "")...); n != 1 {
		t.Errorf("sluice_requests_total of the semaphore's grants: %v, want 1", n)
	}
}
