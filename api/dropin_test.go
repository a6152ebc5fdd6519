package api

import (
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-io/sluice/api/limits"
)

// The drop-in tests: envoyproxy/ratelimit's switches, over real gRPC.

// TestGlobalShadowMode: with ShadowMode, every limit (the limits file's,
// an inline one, a limit of 0) is counted and reported but never
// OVER_LIMIT, and its denials are counted as shadow_denied; the counters
// go on exactly as if enforced, so switching shadow mode off enforces
// from where they are.
func TestGlobalShadowMode(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, func(c *testConfig) { c.ShadowMode = true; c.RateLimitHeaders = true })
	ec := newEnvoyClient(ts)
	route := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("route", "r"), 1, typev3.RateLimitUnit_MINUTE, 0)
	}
	steps := []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		want string
	}{
		{"file rule", rd("service", "auth", "user", "bob"), "OK 2/SECOND per_user r=1 reset=1s"},
		{"file rule again", rd("service", "auth", "user", "bob"), "OK 2/SECOND per_user r=0 reset=1s"},
		{"file rule over: OK", rd("service", "auth", "user", "bob"), "OK 2/SECOND per_user r=0 reset=1s"},
		{"inline", route(), "OK 1/MINUTE r=0 reset=1m0s"},
		{"inline over: OK", route(), "OK 1/MINUTE r=0 reset=1m0s"},
		{"limit 0: OK", rd("closed", "x"), "OK 0/DAY r=0 reset=24h0m0s"},
	}
	for _, st := range steps {
		if got := ec.one("edge", st.d); got != st.want {
			t.Errorf("%s: ShouldRateLimit(%v) = %s; want %s", st.name, st.d.Entries, got, st.want)
		}
	}
	if resp := ec.call("edge", 0, route(), rd("closed", "x")); resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("two descriptors over their limits: overall %v, headers %v; want OK and no headers", resp.OverallCode, resp.ResponseHeadersToAdd)
	}
	if got := decisions(t, ts.srv, "shadow_denied"); got != 5 {
		t.Errorf("decisions{envoy,shadow_denied} = %v; want 5", got)
	}
	if got := decisions(t, ts.srv, "denied"); got != 0 {
		t.Errorf("decisions{envoy,denied} = %v; want 0", got)
	}

	// Enforcing starts from the same counters: the route's one hit in the
	// minute is still there.
	ts.cfg.ShadowMode = false
	ts.restart()
	if got := newEnvoyClient(ts).one("edge", route()); got != "OVER_LIMIT 1/MINUTE r=0 reset=1m0s" {
		t.Errorf("after shadow mode: ShouldRateLimit(route) = %s; want OVER_LIMIT", got)
	}
}

// TestDraft03Headers: HeadersDraft03 writes envoyproxy/ratelimit's three
// fields (limit, remaining, seconds to reset) of the most restrictive
// descriptor, under its default names or under the names given.
func TestDraft03Headers(t *testing.T) {
	headers := func(resp *rlsv3.RateLimitResponse) string {
		var hs []string
		for _, h := range resp.ResponseHeadersToAdd {
			hs = append(hs, h.Key+": "+h.Value)
		}
		return strings.Join(hs, "\n")
	}
	route := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("route", "r"), 2, typev3.RateLimitUnit_SECOND, 60)
	}
	for _, tc := range []struct {
		name  string
		names HeaderNames
		want  []string // after each step
	}{
		{"default names", HeaderNames{}, []string{
			"RateLimit-Limit: 2\nRateLimit-Remaining: 1\nRateLimit-Reset: 60",
			"RateLimit-Limit: 2\nRateLimit-Remaining: 0\nRateLimit-Reset: 60",
			"RateLimit-Limit: 2\nRateLimit-Remaining: 0\nRateLimit-Reset: 30",
			"RateLimit-Limit: 0\nRateLimit-Remaining: 0\nRateLimit-Reset: 86400",
		}},
		{"Envoy's X- names", HeaderNames{Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", Reset: "X-RateLimit-Reset"}, []string{
			"X-RateLimit-Limit: 2\nX-RateLimit-Remaining: 1\nX-RateLimit-Reset: 60",
			"X-RateLimit-Limit: 2\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 60",
			"X-RateLimit-Limit: 2\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 30",
			"X-RateLimit-Limit: 0\nX-RateLimit-Remaining: 0\nX-RateLimit-Reset: 86400",
		}},
		{"one name changed", HeaderNames{Remaining: "Quota-Left"}, []string{
			"RateLimit-Limit: 2\nQuota-Left: 1\nRateLimit-Reset: 60",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, _ := newLimitsServer(t, edgeLimits, func(c *testConfig) {
				c.RateLimitHeaders, c.HeaderFormat, c.HeaderNames = true, HeadersDraft03, tc.names
			})
			ec := newEnvoyClient(ts)
			steps := []struct {
				advance time.Duration
				ds      []*ratelimitv3.RateLimitDescriptor
			}{
				{0, []*ratelimitv3.RateLimitDescriptor{route()}},
				{30 * time.Second, []*ratelimitv3.RateLimitDescriptor{rd("remote_address", "1.1.1.1"), route()}},
				{0, []*ratelimitv3.RateLimitDescriptor{route()}}, // over: reset is when a retry succeeds
				{0, []*ratelimitv3.RateLimitDescriptor{route(), rd("closed", "x")}},
			}
			for i, want := range tc.want {
				ts.clk.Advance(steps[i].advance)
				if got := headers(ec.call("edge", 0, steps[i].ds...)); got != want {
					t.Errorf("step %d: headers\n%s\nwant\n%s", i, got, want)
				}
			}
		})
	}
}

const metadataLimits = `domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 5 }
    metadata:
      team: growth
      tags: { a: 1, nested: { x: 1 } }
  - key: plan
    rate_limit: { unit: minute, requests_per_unit: 5 }
    metadata:
      team: billing
      tier: gold
      tags: { b: two, nested: { y: 2 } }
  - key: closed
    rate_limit: { unit: minute, requests_per_unit: 0 }
    metadata: { denied: yes }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 0 }
    metadata: { shadow: on }
  - key: free
    rate_limit: { unlimited: true }
    metadata: { unlimited: true }
`

// TestDynamicMetadata: with ResponseDynamicMetadata, a response carries
// envoyproxy/ratelimit's dynamic metadata: the domain, the descriptors
// (entries, inline limit, own hits_addend), the request's hits_addend, and
// the metadata of the rules that answered OK, merged in order; without it,
// none. The rules' own metadata is never changed by a merge.
func TestDynamicMetadata(t *testing.T) {
	ts, _ := newLimitsServer(t, metadataLimits, func(c *testConfig) { c.DynamicMetadata = true })
	ec := newEnvoyClient(ts)
	ds := func() []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{
			rd("user", "bob"),
			hits(rd("plan", "p"), 1),
			rd("closed", "x"),
			rd("soft", "x"),
			rd("free", "x"),
			inline(rd("route", "r", "method", "GET"), 10, typev3.RateLimitUnit_MINUTE, 2),
		}
	}
	want := `{
		"domain": "edge",
		"hitsAddend": 1,
		"descriptors": [
			{"entries": ["user=bob"]},
			{"entries": ["plan=p"], "hitsAddend": 1},
			{"entries": ["closed=x"]},
			{"entries": ["soft=x"]},
			{"entries": ["free=x"]},
			{"entries": ["route=r", "method=GET"], "limit": "requests_per_unit:10 unit:MINUTE unit_multiplier:{value:2}"}
		],
		"metadata": {
			"team": "growth",
			"tier": "gold",
			"shadow": true,
			"tags": {"a": 1, "b": "two", "nested": {"x": 1, "y": 2}}
		}
	}`
	var wantStruct structpb.Struct
	if err := protojson.Unmarshal([]byte(want), &wantStruct); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // twice: the first merge must not have changed the rules
		resp := ec.call("edge", 1, ds()...)
		if !proto.Equal(resp.DynamicMetadata, &wantStruct) {
			t.Fatalf("call %d: dynamic metadata\n%v\nwant\n%v", i, protojson.Format(resp.DynamicMetadata), protojson.Format(&wantStruct))
		}
	}
	rule, _ := ts.limits.Current().Lookup("edge", []limits.Entry{{Key: "user", Value: "bob"}})
	if got := protojson.Format(rule.Metadata.GetFields()["tags"]); strings.Contains(got, "two") {
		t.Errorf("the rule's metadata changed: tags = %s", got)
	}

	// Over its limit, a rule's metadata is left out.
	ts.clk.Advance(time.Minute)
	resp := ec.call("edge", 6, rd("user", "bob"))
	if _, ok := resp.DynamicMetadata.GetFields()["metadata"]; ok || resp.DynamicMetadata.GetFields()["hitsAddend"].GetNumberValue() != 6 {
		t.Errorf("over the limit: dynamic metadata %v; want hitsAddend 6 and no metadata", protojson.Format(resp.DynamicMetadata))
	}

	plain, _ := newLimitsServer(t, metadataLimits, nil)
	if resp := newEnvoyClient(plain).call("edge", 0, rd("user", "bob")); resp.DynamicMetadata != nil {
		t.Errorf("without ResponseDynamicMetadata: dynamic metadata %v; want none", resp.DynamicMetadata)
	}
}

const statsLimits = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: service
    value: auth
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: soft
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
`

// ruleSeries returns every series of a per-rule counter as
// "domain/key=value".
func ruleSeries(t *testing.T, rs *ruleStats, stat int) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { rs.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		if m.Desc() != rs.descs[stat] {
			continue
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range pb.Label {
			labels[l.GetName()] = l.GetValue()
		}
		out[labels["domain"]+"/"+labels["key"]] = pb.GetCounter().GetValue()
	}
	return out
}

// TestRuleStatistics: each rule's hits are counted in
// envoyproxy/ratelimit's five statistics, under its statistics key;
// detailed_metric puts the request's values in the key; the keys that
// hold request values are capped, the rest fold into key "other" and are
// counted in sluice_rule_metrics_folded_total.
func TestRuleStatistics(t *testing.T) {
	ts, _ := newLimitsServer(t, statsLimits, func(c *testConfig) { c.RuleMetricsMaxKeys = 2 })
	ec := newEnvoyClient(ts)
	for range 11 { // 10 allowed (the 9th and 10th near the limit), 1 denied
		ec.call("edge", 0, rd("remote_address", "10.0.0.1"))
	}
	ec.call("edge", 3, rd("remote_address", "10.0.0.2")) // 3 hits at once
	ec.call("edge", 0, rd("soft", "x"), rd("soft", "x")) // 1 allowed, 1 over in shadow mode
	for _, user := range []string{"a", "b", "a", "c", "d"} {
		ec.call("edge", 0, rd("service", "auth", "user", user))
	}
	ec.call("edge", 0, inline(rd("route", "r"), 5, typev3.RateLimitUnit_MINUTE, 0))
	ec.call("edge", 0, rd("unknown", "x"))                                                                       // no limit: no statistics
	ec.call("edge", 0, &ratelimitv3.RateLimitDescriptor{Entries: rd("soft", "x").Entries, IsNegativeHits: true}) // a refund is no hit

	rs := ts.srv.ruleStats
	for _, tc := range []struct {
		name string
		stat int
		want map[string]float64
	}{
		{"hits", statHits, map[string]float64{
			"edge/remote_address": 14, "edge/soft": 2, "edge/service_auth.user_a": 2, "edge/service_auth.user_b": 1,
			"edge/other": 2, "other/other": 1,
		}},
		{"within_limit", statWithin, map[string]float64{
			"edge/remote_address": 13, "edge/soft": 1, "edge/service_auth.user_a": 2, "edge/service_auth.user_b": 1,
			"edge/other": 2, "other/other": 1,
		}},
		{"near_limit", statNear, map[string]float64{
			"edge/remote_address": 2, "edge/soft": 1, "edge/service_auth.user_a": 0, "edge/service_auth.user_b": 0,
			"edge/other": 0, "other/other": 0,
		}},
		{"over_limit", statOver, map[string]float64{
			"edge/remote_address": 1, "edge/soft": 1, "edge/service_auth.user_a": 0, "edge/service_auth.user_b": 0,
			"edge/other": 0, "other/other": 0,
		}},
		{"shadow_mode", statShadow, map[string]float64{
			"edge/remote_address": 0, "edge/soft": 1, "edge/service_auth.user_a": 0, "edge/service_auth.user_b": 0,
			"edge/other": 0, "other/other": 0,
		}},
	} {
		if got := ruleSeries(t, rs, tc.stat); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: series %v; want %v", tc.name, got, tc.want)
		}
	}
	var m dto.Metric
	if err := rs.folded.Write(&m); err != nil || m.GetCounter().GetValue() != 3 {
		t.Errorf("sluice_rule_metrics_folded_total = %v (%v); want 3 (users c and d, the inline limit)", m.GetCounter().GetValue(), err)
	}
}

// TestRuleStatisticsBounded: however many values clients send, the
// series of keys that hold request values stay within the bound.
func TestRuleStatisticsBounded(t *testing.T) {
	ts, _ := newLimitsServer(t, statsLimits, func(c *testConfig) { c.RuleMetricsMaxKeys = 10 })
	ec := newEnvoyClient(ts)
	for i := range 200 {
		ec.call("edge", 0, rd("service", "auth", "user", fmt.Sprint(i)), inline(rd("ip", fmt.Sprint(i)), 5, typev3.RateLimitUnit_MINUTE, 0))
	}
	got := ruleSeries(t, ts.srv.ruleStats, statHits)
	if len(got) != 10+2 { // the cap, edge/other, other/other
		t.Errorf("%d series of sluice_rule_hits_total; want 12: %v", len(got), got)
	}
	var total float64
	for _, v := range got {
		total += v
	}
	if total != 400 {
		t.Errorf("hits over all series = %v; want 400 (folded hits are still counted)", total)
	}
	var m dto.Metric
	if err := ts.srv.ruleStats.folded.Write(&m); err != nil || m.GetCounter().GetValue() != 390 {
		t.Errorf("sluice_rule_metrics_folded_total = %v (%v); want 390 (every descriptor past the first 10 keys)", m.GetCounter().GetValue(), err)
	}
}
