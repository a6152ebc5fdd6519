package node

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluice-io/sluice/api/limits/xdstest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// The drop-in tests: what users of envoyproxy/ratelimit script against,
// on a real node.

const dropinLimits = `domain: dummy
descriptors:
  - key: one_per_day
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: two_per_minute
    value: something
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
`

// newDropinServer starts a node on a limits file holding yaml.
func newDropinServer(t *testing.T, yaml string, edit func(*Config)) *testServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return newTestServer(t, func(c *Config) {
		c.LimitsFile = path
		c.LimitsPollInterval = time.Hour
		if edit != nil {
			edit(c)
		}
	})
}

// httpDo sends a request to the node's HTTP listener and returns the
// status and body.
func (ts *testServer) httpDo(method, path, token, body string) (int, string) {
	ts.t.Helper()
	req, err := http.NewRequestWithContext(ts.ctx(), method, "http://"+ts.srv.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		ts.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postJSON posts body to /json and decodes the answer when it is one.
func (ts *testServer) postJSON(token, body string) (int, *rlsv3.RateLimitResponse, string) {
	ts.t.Helper()
	code, out := ts.httpDo(http.MethodPost, "/json", token, body)
	if code != http.StatusOK && code != http.StatusTooManyRequests {
		return code, nil, out
	}
	var resp rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		ts.t.Fatalf("POST /json %s: %d with a body that is no RateLimitResponse: %v\n%s", body, code, err, out)
	}
	return code, &resp, out
}

// TestJSONEndpoint: /json decides as ShouldRateLimit does, answers
// envoyproxy/ratelimit's JSON with 200 or 429, refuses what is not a
// request, and asks a refund for its credential.
func TestJSONEndpoint(t *testing.T) {
	t.Parallel()
	ts := newDropinServer(t, dropinLimits, func(c *Config) { c.AdminToken, c.RefundToken = "adm", "ref" })
	const day = `{"domain": "dummy", "descriptors": [{"entries": [{"key": "one_per_day", "value": "x"}]}]}`

	code, resp, raw := ts.postJSON("", day)
	if code != http.StatusOK || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first POST /json %s = %d %s; want 200, OK", day, code, raw)
	}
	for _, want := range []string{`"overallCode":"OK"`, `"requestsPerUnit":1`, `"unit":"DAY"`} {
		if !strings.Contains(strings.ReplaceAll(raw, " ", ""), want) {
			t.Errorf("first POST /json: body %s lacks %s", raw, want)
		}
	}
	code, resp, raw = ts.postJSON("", day)
	if code != http.StatusTooManyRequests || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second POST /json %s = %d %s; want 429, OVER_LIMIT", day, code, raw)
	}

	// hits_addend, in either spelling, is the cost: 3 over a limit of 2
	// (a shadow rule: OK, counted apart).
	for _, body := range []string{
		`{"domain": "dummy", "hits_addend": 3, "descriptors": [{"entries": [{"key": "two_per_minute", "value": "something"}]}]}`,
		`{"domain": "dummy", "hitsAddend": 3, "descriptors": [{"entries": [{"key": "two_per_minute", "value": "something"}]}]}`,
	} {
		code, resp, raw = ts.postJSON("", body)
		if code != http.StatusOK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
			t.Errorf("POST /json %s = %d %s; want 200, OK with 2 remaining (a shadow rule)", body, code, raw)
		}
	}

	// A refund takes a credential when the node has one.
	refund := `{"domain": "dummy", "descriptors": [{"entries": [{"key": "one_per_day", "value": "x"}], "is_negative_hits": true}]}`
	if code, _, raw := ts.postJSON("", refund); code != http.StatusUnauthorized {
		t.Errorf("POST /json refund without a token = %d %s; want 401", code, raw)
	}
	if code, _, raw := ts.postJSON("ref", refund); code != http.StatusOK {
		t.Errorf("POST /json refund with the refund token = %d %s; want 200", code, raw)
	}
	if code, _, raw := ts.postJSON("", day); code != http.StatusOK {
		t.Errorf("POST /json after the refund = %d %s; want 200", code, raw)
	}

	for _, tc := range []struct {
		method, body string
		want         int
	}{
		{http.MethodPost, `{"domain": "dummy"`, http.StatusBadRequest},
		{http.MethodPost, `{"domain": "dummy", "descriptors": [{"entries": [{"key": "k"}]}], "bogus": 1}`, http.StatusBadRequest},
		{http.MethodPost, `{"domain": "", "descriptors": [{"entries": [{"key": "k"}]}]}`, http.StatusBadRequest},
		{http.MethodPost, `{"domain": "dummy", "descriptors": [{"entries": []}]}`, http.StatusBadRequest},
		{http.MethodPost, `{"domain": "dummy", "descriptors": [{"entries": [{"key": "k"}]}]}`, http.StatusOK},
		{http.MethodGet, ``, http.StatusMethodNotAllowed},
		{http.MethodPost, `{"domain": "` + strings.Repeat("d", 5<<20) + `"}`, http.StatusRequestEntityTooLarge},
	} {
		code, body := ts.httpDo(tc.method, "/json", "", tc.body)
		if code != tc.want {
			t.Errorf("%s /json %.80s = %d %q; want %d", tc.method, tc.body, code, body, tc.want)
		}
	}
}

// TestRLConfigEndpoint: /rlconfig lists the rules in force in
// envoyproxy/ratelimit's format, behind the admin token when one is set,
// and follows a reload.
func TestRLConfigEndpoint(t *testing.T) {
	t.Parallel()
	ts := newDropinServer(t, dropinLimits, func(c *Config) { c.AdminToken = "adm" })
	want := "dummy.one_per_day: unit=DAY requests_per_unit=1, shadow_mode: false, quota_mode: false\n" +
		"dummy.two_per_minute_something: unit=MINUTE requests_per_unit=2, shadow_mode: true, quota_mode: false\n"
	if code, body := ts.httpDo(http.MethodGet, "/rlconfig", "adm", ""); code != http.StatusOK || body != want {
		t.Errorf("GET /rlconfig = %d\n%s\nwant 200\n%s", code, body, want)
	}
	for _, token := range []string{"", "wrong"} {
		if code, body := ts.httpDo(http.MethodGet, "/rlconfig", token, ""); code != http.StatusUnauthorized {
			t.Errorf("GET /rlconfig with token %q = %d %q; want 401", token, code, body)
		}
	}
	if err := os.WriteFile(ts.cfg.LimitsFile, []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ts.srv.ReloadLimits(); err != nil {
		t.Fatal(err)
	}
	want = "other.k: unit=HOUR requests_per_unit=7, shadow_mode: false, quota_mode: false\n"
	if code, body := ts.httpDo(http.MethodGet, "/rlconfig", "adm", ""); code != http.StatusOK || body != want {
		t.Errorf("GET /rlconfig after a reload = %d\n%s\nwant 200\n%s", code, body, want)
	}

	open := newTestServer(t, nil) // no limits file, no token
	if code, body := open.httpDo(http.MethodGet, "/rlconfig", "", ""); code != http.StatusOK || body != "" {
		t.Errorf("GET /rlconfig without a limits file = %d %q; want 200 and nothing", code, body)
	}
}

// TestShadowAndDraft03Headers: --shadow and --rate-limit-headers-format
// draft03 with names of its own reach the Envoy API of a node; names
// without draft03 are refused.
func TestShadowAndDraft03Headers(t *testing.T) {
	t.Parallel()
	ts := newDropinServer(t, dropinLimits, func(c *Config) {
		c.ShadowMode, c.RateLimitHeaders, c.RateLimitHeadersFormat = true, true, "draft03"
		c.RateLimitHeaderNames.Limit = "X-RateLimit-Limit"
	})
	ec := rlsv3.NewRateLimitServiceClient(ts.conn)
	req := &rlsv3.RateLimitRequest{Domain: "dummy", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "one_per_day", Value: "x"}}},
	}}
	resp, err := ec.ShouldRateLimit(ts.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit(2 hits over a limit of 1) with ShadowMode = %v; want OK", resp)
	}
	if len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("ShadowMode: headers %v; want none (shadowed limits never show)", resp.ResponseHeadersToAdd)
	}
	ts.stop()

	ts = newDropinServer(t, dropinLimits, func(c *Config) {
		c.RateLimitHeaders, c.RateLimitHeadersFormat = true, "draft03"
		c.RateLimitHeaderNames.Limit = "X-RateLimit-Limit"
	})
	req.HitsAddend = 1
	if resp, err = rlsv3.NewRateLimitServiceClient(ts.conn).ShouldRateLimit(ts.ctx(), req); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range resp.ResponseHeadersToAdd {
		got = append(got, h.Key+": "+h.Value)
	}
	if want := "X-RateLimit-Limit: 1, RateLimit-Remaining: 0, RateLimit-Reset: 86400"; strings.Join(got, ", ") != want {
		t.Errorf("draft03 headers = %q; want %q", strings.Join(got, ", "), want)
	}

	cfg := DefaultConfig()
	cfg.RateLimitHeaderNames.Reset = "X-Reset"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "draft03") {
		t.Errorf("Validate(a header name without draft03) = %v; want an error naming draft03", err)
	}
	cfg.RateLimitHeadersFormat = "draft04"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--rate-limit-headers-format") {
		t.Errorf("Validate(format draft04) = %v; want an error naming --rate-limit-headers-format", err)
	}
}

// TestResponseDynamicMetadata: with ResponseDynamicMetadata, a node's
// answers (here over /json) carry the dynamic metadata, with the metadata
// of the rule that allowed the request.
func TestResponseDynamicMetadata(t *testing.T) {
	t.Parallel()
	ts := newDropinServer(t, dropinLimits+"    metadata: { team: growth }\n", func(c *Config) { c.ResponseDynamicMetadata = true })
	code, resp, raw := ts.postJSON("", `{"domain": "dummy", "descriptors": [{"entries": [{"key": "two_per_minute", "value": "something"}]}]}`)
	if code != http.StatusOK || resp.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["team"].GetStringValue() != "growth" {
		t.Errorf("POST /json = %d %s; want dynamicMetadata with metadata.team growth", code, raw)
	}
}

// TestRuleMetrics: a node's /metrics carries the per-rule statistics, by
// domain and rule key, and the count of folded keys from the start.
func TestRuleMetrics(t *testing.T) {
	t.Parallel()
	ts := newDropinServer(t, dropinLimits, func(c *Config) { c.RuleMetricsMaxKeys = 5 })
	if _, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics"); !strings.Contains(body, "\nsluice_rule_metrics_folded_total 0") {
		t.Errorf("/metrics of a fresh node lacks sluice_rule_metrics_folded_total 0")
	}
	for range 2 {
		ts.postJSON("", `{"domain": "dummy", "descriptors": [{"entries": [{"key": "one_per_day", "value": "x"}]}]}`)
	}
	_, body := httpGet(t, "http://"+ts.srv.HTTPAddr()+"/metrics")
	for _, want := range []string{
		`sluice_rule_hits_total{domain="dummy",key="one_per_day"} 2`,
		`sluice_rule_within_limit_hits_total{domain="dummy",key="one_per_day"} 1`,
		`sluice_rule_near_limit_hits_total{domain="dummy",key="one_per_day"} 1`,
		`sluice_rule_over_limit_hits_total{domain="dummy",key="one_per_day"} 1`,
		`sluice_rule_shadow_mode_hits_total{domain="dummy",key="one_per_day"} 0`,
	} {
		if !strings.Contains(body, "\n"+want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cfg := DefaultConfig()
	cfg.NearLimitRatio = 1.5
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--near-limit-ratio") {
		t.Errorf("Validate(near limit ratio 1.5) = %v; want an error naming --near-limit-ratio", err)
	}
}

// TestMergeDomainConfig: with MergeDomainConfig, a node loads a domain
// spread over two files and decides by the rules of both; without it, the
// node refuses to start.
func TestMergeDomainConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, data := range map[string]string{
		"a.yaml": "domain: dummy\ndescriptors:\n  - key: one_per_day\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
		"b.yaml": "domain: dummy\ndescriptors:\n  - key: two_per_day\n    rate_limit: {unit: day, requests_per_unit: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.DataDir, cfg.LimitsFile = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), dir
	if n, err := New(cfg); err == nil {
		n.Shutdown(t.Context())
		t.Fatal("New with a domain in two files, without MergeDomainConfig: no error")
	} else if !strings.Contains(err.Error(), "--merge-domain-config") {
		t.Errorf("New with a domain in two files = %v; want a hint at --merge-domain-config", err)
	}

	ts := newTestServer(t, func(c *Config) { c.LimitsFile, c.MergeDomainConfig = dir, true })
	for key, want := range map[string]uint32{"one_per_day": 1, "two_per_day": 2} {
		_, resp, raw := ts.postJSON("", `{"domain": "dummy", "descriptors": [{"entries": [{"key": "`+key+`"}]}]}`)
		if resp == nil || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != want {
			t.Errorf("POST /json for %s = %s; want the limit %d of its file", key, raw, want)
		}
	}
}

// TestLimitsOverXDS: a node with LimitsXDS takes its limits from the
// management server: not ready (nor healthy on envoyproxy/ratelimit's
// /healthcheck) until the first set is in force, then it
// decides by them, lists them on /rlconfig, and follows each new version.
func TestLimitsOverXDS(t *testing.T) {
	t.Parallel()
	xds := xdstest.New(t)
	ts := newTestServer(t, func(c *Config) {
		c.LimitsXDS = LimitsXDSConfig{Server: xds.Addr, NodeID: "sluice-a",
			NodeMetadata: map[string]string{"zone": "a"}, Headers: map[string]string{"x-token": "t0k"}}
	})
	base := "http://" + ts.srv.HTTPAddr()
	if code, body := httpGet(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "xDS") {
		t.Errorf("/readyz before the limits arrived = %d %q; want 503 waiting for xDS", code, body)
	}
	// envoyproxy/ratelimit's health check answers 500 until it serves.
	if code, body := httpGet(t, base+"/healthcheck"); code != http.StatusInternalServerError || !strings.Contains(body, "xDS") {
		t.Errorf("/healthcheck before the limits arrived = %d %q; want 500 waiting for xDS", code, body)
	}
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := healthpb.NewHealthClient(ts.conn).Check(ts.ctx(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status
	}
	if got := health(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("grpc health before the limits arrived = %v; want NOT_SERVING", got)
	}
	if first := xds.Request(); first.GetNode().GetId() != "sluice-a" || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" {
		t.Errorf("first xDS request from node %v; want sluice-a, zone a", first.GetNode())
	}
	if got := xds.Metadata().Get("x-token"); len(got) != 1 || got[0] != "t0k" {
		t.Errorf("xDS stream metadata x-token = %v; want t0k", got)
	}
	day := func(n uint32) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: "dummy", Domain: "dummy", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "one_per_day", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: n}},
		}}
	}
	xds.Send("v1", "n1", day(1))
	if ack := xds.Request(); ack.VersionInfo != "v1" || ack.ErrorDetail != nil {
		t.Fatalf("after v1: %v; want an ACK of v1", ack)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == http.StatusOK
	}, "/readyz to answer 200 once the limits arrived")
	if got := health(); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc health once the limits arrived = %v; want SERVING", got)
	}
	if code, body := httpGet(t, base+"/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck once the limits arrived = %d %q; want 200 OK, as envoyproxy/ratelimit answers", code, body)
	}
	const req = `{"domain": "dummy", "descriptors": [{"entries": [{"key": "one_per_day", "value": "x"}]}]}`
	if code, _, raw := ts.postJSON("", req); code != http.StatusOK {
		t.Errorf("first decision by the xDS limits = %d %s; want 200", code, raw)
	}
	if code, _, raw := ts.postJSON("", req); code != http.StatusTooManyRequests {
		t.Errorf("second decision by the xDS limits (1 a day) = %d %s; want 429", code, raw)
	}
	xds.Send("v2", "n2", day(5))
	xds.Request()
	if _, body := ts.httpDo(http.MethodGet, "/rlconfig", "", ""); body != "dummy.one_per_day: unit=DAY requests_per_unit=5, shadow_mode: false, quota_mode: false\n" {
		t.Errorf("/rlconfig after v2 = %q; want the rule at 5 a day", body)
	}
	if code, _, raw := ts.postJSON("", req); code != http.StatusOK {
		t.Errorf("decision after v2 raised the limit = %d %s; want 200", code, raw)
	}

	cfg := DefaultConfig()
	cfg.LimitsFile, cfg.LimitsXDS.Server = "limits.yaml", "127.0.0.1:1"
	if err := cfg.Validate(); err == nil {
		t.Error("Validate(a limits file and an xDS server) = nil; want an error")
	}
}
