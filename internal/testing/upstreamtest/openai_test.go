package upstreamtest

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/upstream"
)

// An OpenAI-style answer read with upstream.OpenAI: the refusal says the
// burst, none left, a reset until full that, over the tokens missing,
// gives the upstream's rate; and retry-after in whole seconds.
func TestOpenAI(t *testing.T) {
	s := NewOpenAI(Config{Policies: []Policy{{Rate: 100, Burst: 20}}})
	defer s.Close()
	var last upstream.Signal
	for range 40 {
		resp, err := http.Get(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		last = upstream.OpenAI.Parse(resp)
		if last.Refused {
			break
		}
	}
	if !last.Refused || last.RetryAfter != time.Second || len(last.Quotas) != 1 {
		t.Fatalf("no refusal with retry-after 1 and one quota in 40 requests at once: %+v", last)
	}
	q := last.Quotas[0]
	if q.Limit != 20 || q.Remaining != 0 || !q.UntilFull || q.Reset <= 0 || q.Reset > 201*time.Millisecond {
		t.Fatalf("the refusal's quota: %+v; want limit 20, none left, until full within 200ms", q)
	}
	// Remaining is rounded down: the rate read is at or above the
	// upstream's, by less than one request in 20.
	if r := float64(q.Limit-q.Remaining) / q.Reset.Seconds(); r < 99 || r > 106 {
		t.Errorf("(limit − remaining) ÷ reset = %.1f a second, want the upstream's 100", r)
	}
	if st := s.Stats(); st.Refused != 1 || st.Accepted < 20 {
		t.Errorf("stats %+v", st)
	}
}

// A rolling window in OpenAI's words: full again when the last arrival it
// counts leaves it.
func TestOpenAIWindow(t *testing.T) {
	s := NewOpenAI(Config{Policies: []Policy{{Rate: 3, Window: time.Hour}}})
	defer s.Close()
	for i, want := range []int64{2, 1, 0, 0} {
		resp, err := http.Get(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		sig := upstream.OpenAI.Parse(resp)
		if len(sig.Quotas) != 1 || sig.Refused != (i == 3) {
			t.Fatalf("request %d: %+v", i, sig)
		}
		q := sig.Quotas[0]
		if q.Limit != 3 || q.Remaining != want || q.Reset < 59*time.Minute || q.Reset > time.Hour {
			t.Errorf("request %d: %+v; want limit 3, %d left, full again in an hour", i, q, want)
		}
	}
}
