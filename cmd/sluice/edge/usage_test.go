package edge

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestResponseCostTrailer: a rule with response_cost takes each request's
// cost from the origin's response trailer, once the proxied response is
// done, and records it even over the limit: the request after an
// overshoot is refused; the metrics count the reports.
func TestResponseCostTrailer(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Tokens-Used")
		w.WriteHeader(200)
		w.Write([]byte("tokens streamed"))
		w.Header().Set("X-Tokens-Used", r.URL.Query().Get("tokens"))
	}))
	t.Cleanup(origin.Close)
	rules, err := ParseRules([]byte(`
routes:
  - name: chat
    rules:
      - {name: user_tokens, key: "header:X-User", limit: 1000, window: 1m, response_cost: "response-trailer:X-Tokens-Used"}
`))
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, origin.URL, n.Addr, func(c *Config) { c.Rules = rules })
	url := "http://" + e.Addr()
	for i, step := range []struct {
		tokens string
		want   int
	}{
		{"900", 200},
		{"500", 200}, // 900 < 1000: through, and 1400 spent
		{"1", 429},
	} {
		r := get(t, "GET", url+"/v1/chat?tokens="+step.tokens, map[string]string{"X-User": "u1"}, "")
		if r.status != step.want {
			t.Fatalf("request %d (%s tokens) = %d %q; want %d", i, step.tokens, r.status, r.body, step.want)
		}
	}
	for result, want := range map[string]float64{"recorded": 1, "over_limit": 1} {
		var m dto.Metric
		if err := e.metrics.usage.WithLabelValues("chat", "user_tokens", result).Write(&m); err != nil || m.GetCounter().GetValue() != want {
			t.Errorf("sluice_edge_usage_reports_total{result=%q} = %v, %v; want %v", result, m.GetCounter().GetValue(), err, want)
		}
	}
	_, err = ParseRules([]byte(`
routes:
  - name: chat
    rules:
      - {name: a, key: ip, limit: 10, window: 1m, response_cost: "body:tokens"}
      - {name: b, key: ip, limit: 10, window: 1m, cost: 2, response_cost: "response-header:X"}
`))
	for _, want := range []string{`rule 0 ("a"): response cost "body:tokens"`, `rule 1 ("b"): cost 2 with a response cost`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRules(bad response costs) = %v; want it to say %s", err, want)
		}
	}
}
