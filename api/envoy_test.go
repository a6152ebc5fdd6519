package api

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice/api/overrides"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// envoyClient calls a test server's Envoy RLS v3 service through the
// generated gRPC client.
type envoyClient struct {
	t  testing.TB
	ts *testServer
	c  rlsv3.RateLimitServiceClient
}

func newEnvoyClient(ts *testServer) *envoyClient {
	return &envoyClient{t: ts.t, ts: ts, c: rlsv3.NewRateLimitServiceClient(ts.conn)}
}

// try sends a request and checks the invariants of every answer: one status
// per descriptor, and no UNKNOWN code anywhere.
func (ec *envoyClient) try(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := ec.c.ShouldRateLimit(ec.ts.ctx(), req)
	if err != nil {
		return nil, err
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
		return nil, fmt.Errorf("ShouldRateLimit(%v): overall_code UNKNOWN", req)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		return nil, fmt.Errorf("ShouldRateLimit(%v): %d statuses for %d descriptors", req, len(resp.Statuses), len(req.Descriptors))
	}
	for i, st := range resp.Statuses {
		if st.Code == rlsv3.RateLimitResponse_UNKNOWN {
			return nil, fmt.Errorf("ShouldRateLimit(%v): status %d has code UNKNOWN", req, i)
		}
	}
	return resp, nil
}

// call sends a request of domain with request-level hits and fails the test
// on error.
func (ec *envoyClient) call(domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	ec.t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}
	resp, err := ec.try(req)
	if err != nil {
		ec.t.Fatalf("ShouldRateLimit(%v) = %v", req, err)
	}
	return resp
}

// one sends a request of one descriptor and returns its status, summarized.
func (ec *envoyClient) one(domain string, d *ratelimitv3.RateLimitDescriptor) string {
	ec.t.Helper()
	resp := ec.call(domain, 0, d)
	if (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) != (resp.Statuses[0].Code == rlsv3.RateLimitResponse_OVER_LIMIT) {
		ec.t.Fatalf("ShouldRateLimit(%v): overall %v but the only status %v", d, resp.OverallCode, resp.Statuses[0].Code)
	}
	return summary(resp.Statuses[0])
}

// summary prints a status as "CODE limit r=remaining reset=duration", or
// just the code and remaining when it has no current_limit.
func summary(st *rlsv3.RateLimitResponse_DescriptorStatus) string {
	if st.CurrentLimit == nil {
		if st.DurationUntilReset != nil {
			return fmt.Sprintf("%v (no limit, but a reset)", st.Code)
		}
		return fmt.Sprintf("%v r=%d", st.Code, st.LimitRemaining)
	}
	l := st.CurrentLimit
	s := fmt.Sprintf("%v %d/%v", st.Code, l.RequestsPerUnit, l.Unit)
	if l.UnitMultiplier != nil {
		s += fmt.Sprintf("x%d", l.UnitMultiplier.Value)
	}
	if l.Name != "" {
		s += " " + l.Name
	}
	reset := "nil"
	if st.DurationUntilReset != nil {
		reset = st.DurationUntilReset.AsDuration().String()
	}
	return s + fmt.Sprintf(" r=%d reset=%s", st.LimitRemaining, reset)
}

// rd builds a descriptor from key, value pairs.
func rd(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// inline gives d an inline limit; mult 0 leaves unit_multiplier unset.
func inline(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

// hits sets d's own hits_addend.
func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// writeLimits writes a limits file and returns its path.
func writeLimits(t testing.TB, path, yaml string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newLimitsServer starts a node on a limits file holding yaml. The file is
// polled rarely: tests reload it with Reload.
func newLimitsServer(t *testing.T, yaml string, edit func(*testConfig)) (*testServer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	writeLimits(t, path, yaml)
	ts := newTestServer(t, func(c *testConfig) {
		c.LimitsFile = path
		c.LimitsPollInterval = time.Hour
		if edit != nil {
			edit(c)
		}
	})
	return ts, path
}

// decisions reads sluice_decisions_total{api="envoy",result=result}.
func decisions(t testing.TB, s *Server, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.decisions.WithLabelValues("envoy", result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestEnvoyExactUnderConcurrency: many callers on one descriptor get
// exactly its limit allowed, never more.
func TestEnvoyExactUnderConcurrency(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	var ok, over atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				resp, err := ec.try(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					inline(rd("route", "hot"), 100, typev3.RateLimitUnit_MINUTE, 0),
				}})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				} else {
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 100 || over.Load() != 300 {
		t.Fatalf("400 requests on a limit of 100/minute: %d OK, %d OVER_LIMIT; want exactly 100 and 300", ok.Load(), over.Load())
	}
	if got, want := decisions(t, ts.srv, "allowed"), 100.0; got != want {
		t.Errorf("decisions{envoy,allowed} = %v; want %v", got, want)
	}
	if got, want := decisions(t, ts.srv, "denied"), 300.0; got != want {
		t.Errorf("decisions{envoy,denied} = %v; want %v", got, want)
	}
}

// TestEnvoyInlineLimitWindows: the window of an inline limit is unit ×
// unit_multiplier, and current_limit says so.
func TestEnvoyInlineLimitWindows(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	d := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("route", "thirty"), 2, typev3.RateLimitUnit_SECOND, 30)
	}
	steps := []struct {
		advance time.Duration
		want    string
	}{
		{0, "OK 2/SECONDx30 r=1 reset=30s"},
		{10 * time.Second, "OK 2/SECONDx30 r=0 reset=30s"},
		{0, "OVER_LIMIT 2/SECONDx30 r=0 reset=30s"},
		{19 * time.Second, "OVER_LIMIT 2/SECONDx30 r=0 reset=11s"},
		{time.Second, "OK 2/SECONDx30 r=0 reset=30s"}, // the first hit left at 30s
		{0, "OVER_LIMIT 2/SECONDx30 r=0 reset=30s"},
	}
	for i, st := range steps {
		ts.clk.Advance(st.advance)
		if got := ec.one("edge", d()); got != st.want {
			t.Errorf("step %d (after +%v): %s; want %s", i, st.advance, got, st.want)
		}
	}
	// No multiplier means 1; MINUTE × 2 is a two-minute window.
	if got, want := ec.one("edge", inline(rd("route", "plain"), 1, typev3.RateLimitUnit_HOUR, 0)), "OK 1/HOUR r=0 reset=1h0m0s"; got != want {
		t.Errorf("1/HOUR: %s; want %s", got, want)
	}
	if got, want := ec.one("edge", inline(rd("route", "two"), 1, typev3.RateLimitUnit_MINUTE, 2)), "OK 1/MINUTEx2 r=0 reset=2m0s"; got != want {
		t.Errorf("1/MINUTE×2: %s; want %s", got, want)
	}
	ts.clk.Advance(119 * time.Second)
	if got, want := ec.one("edge", inline(rd("route", "two"), 1, typev3.RateLimitUnit_MINUTE, 2)), "OVER_LIMIT 1/MINUTEx2 r=0 reset=1s"; got != want {
		t.Errorf("1/MINUTE×2 after 1m59s: %s; want %s", got, want)
	}
}

// TestEnvoyHitsAddend: the descriptor's hits_addend beats the request's; an
// explicit 0 peeks; the request's 0 means 1.
func TestEnvoyHitsAddend(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	lim := func(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
		return inline(d, 10, typev3.RateLimitUnit_MINUTE, 0)
	}
	steps := []struct {
		name       string
		reqHits    uint32
		d          *ratelimitv3.RateLimitDescriptor
		wantCode   rlsv3.RateLimitResponse_Code
		wantRemain uint32
	}{
		{"request hits 0 means 1", 0, lim(rd("k", "a")), rlsv3.RateLimitResponse_OK, 9},
		{"request hits 3", 3, lim(rd("k", "a")), rlsv3.RateLimitResponse_OK, 6},
		{"descriptor hits 2 beats request 5", 5, hits(lim(rd("k", "a")), 2), rlsv3.RateLimitResponse_OK, 4},
		{"descriptor hits 0 peeks", 7, hits(lim(rd("k", "a")), 0), rlsv3.RateLimitResponse_OK, 4},
		{"request hits 5 do not fit in 4", 5, lim(rd("k", "a")), rlsv3.RateLimitResponse_OVER_LIMIT, 4},
		{"denied hits were not recorded", 0, hits(lim(rd("k", "a")), 0), rlsv3.RateLimitResponse_OK, 4},
		{"descriptor hits 4 fit exactly", 0, hits(lim(rd("k", "a")), 4), rlsv3.RateLimitResponse_OK, 0},
		{"a peek on a full key is OK", 0, hits(lim(rd("k", "a")), 0), rlsv3.RateLimitResponse_OK, 0},
	}
	for _, st := range steps {
		resp := ec.call("edge", st.reqHits, st.d)
		got := resp.Statuses[0]
		if got.Code != st.wantCode || got.LimitRemaining != st.wantRemain || resp.OverallCode != st.wantCode {
			t.Errorf("%s: overall %v, %s; want %v with %d remaining", st.name, resp.OverallCode, summary(got), st.wantCode, st.wantRemain)
		}
	}
	// Two descriptors of one request each take their own hits.
	resp := ec.call("edge", 2, lim(rd("k", "b")), hits(lim(rd("k", "c")), 5))
	if a, b := resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining; a != 8 || b != 5 {
		t.Errorf("request hits 2 and descriptor hits 5: remaining %d and %d; want 8 and 5", a, b)
	}
}

// TestEnvoyNegativeHits: is_negative_hits gives hits back, never below
// zero, and is always OK.
func TestEnvoyNegativeHits(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	lim := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 0)
	}
	neg := func(n uint64) *ratelimitv3.RateLimitDescriptor {
		d := hits(lim(), n)
		d.IsNegativeHits = true
		return d
	}
	if got, want := ec.one("edge", hits(lim(), 10)), "OK 10/MINUTE r=0 reset=1m0s"; got != want {
		t.Fatalf("take 10: %s; want %s", got, want)
	}
	if got := ec.one("edge", lim()); !strings.HasPrefix(got, "OVER_LIMIT") {
		t.Fatalf("take 1 more: %s; want OVER_LIMIT", got)
	}
	if got, want := ec.one("edge", neg(3)), "OK 10/MINUTE r=3 reset=1m0s"; got != want {
		t.Errorf("give 3 back: %s; want %s", got, want)
	}
	if got, want := ec.one("edge", lim()), "OK 10/MINUTE r=2 reset=1m0s"; got != want {
		t.Errorf("take 1 after giving 3 back: %s; want %s", got, want)
	}
	if got, want := ec.one("edge", neg(1000)), "OK 10/MINUTE r=10 reset=0s"; got != want {
		t.Errorf("give back more than was taken: %s; want %s", got, want)
	}
	ec.one("edge", hits(lim(), 4))
	if got, want := ec.one("edge", neg(math.MaxUint64)), "OK 10/MINUTE r=10 reset=0s"; got != want {
		t.Errorf("give back 2^64-1: %s; want %s", got, want)
	}
	// With the request's hits_addend.
	d := lim()
	d.IsNegativeHits = true
	ec.call("edge", 4, hits(lim(), 6))
	if resp := ec.call("edge", 4, d); resp.Statuses[0].LimitRemaining != 8 {
		t.Errorf("take 6, give back the request's 4: %s; want 8 remaining", summary(resp.Statuses[0]))
	}
}

// TestEnvoyNeverFits: a limit of 0 or a cost above the limit answers
// OVER_LIMIT, not an error, and records nothing.
func TestEnvoyNeverFits(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	if got, want := ec.one("edge", inline(rd("route", "blocked"), 0, typev3.RateLimitUnit_SECOND, 0)), "OVER_LIMIT 0/SECOND r=0 reset=1s"; got != want {
		t.Errorf("limit 0: %s; want %s", got, want)
	}
	ec.one("edge", hits(inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 0), 3))
	if got, want := ec.one("edge", hits(inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 0), 11)), "OVER_LIMIT 10/MINUTE r=7 reset=1m0s"; got != want {
		t.Errorf("cost 11 on a limit of 10: %s; want %s", got, want)
	}
	resp := ec.call("edge", 1<<31, inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 0))
	if got, want := summary(resp.Statuses[0]), "OVER_LIMIT 10/MINUTE r=7 reset=1m0s"; got != want {
		t.Errorf("request hits 2^31 on a limit of 10: %s; want %s", got, want)
	}
	if got, want := ec.one("edge", hits(inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 0), 0)), "OK 10/MINUTE r=7 reset=1m0s"; got != want {
		t.Errorf("peek after the refused costs: %s; want %s (nothing recorded)", got, want)
	}
}

// TestEnvoyNoLimit: a descriptor that no limit applies to is OK, carries no
// current_limit, and counts nothing; it does not stop the others.
func TestEnvoyNoLimit(t *testing.T) {
	ts := newTestServer(t, nil) // no limits file
	ec := newEnvoyClient(ts)
	resp := ec.call("edge", 0, rd("path", "/anything"), inline(rd("k", "v"), 0, typev3.RateLimitUnit_SECOND, 0))
	if got, want := summary(resp.Statuses[0]), "OK r=0"; got != want {
		t.Errorf("descriptor without a limit: %s; want %s", got, want)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overall = %v; want OVER_LIMIT from the second descriptor", resp.OverallCode)
	}
	// A long value on a descriptor without a limit is not an error: its key
	// is never used.
	if got, want := ec.one("edge", rd("user_agent", strings.Repeat("x", 2000))), "OK r=0"; got != want {
		t.Errorf("long unlimited descriptor: %s; want %s", got, want)
	}
	if keys, err := ts.srv.engine.List(ts.ctx(), "edge|path", "", 10); err != nil || len(keys) != 0 {
		t.Errorf("keys under edge|path = %v, %v; want none", keys, err)
	}
}

const edgeLimits = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: service
    value: auth
    descriptors:
      - key: user
        rate_limit:
          name: per_user
          unit: second
          requests_per_unit: 2
      - key: tier
        value: free
        rate_limit:
          name: free_tier
          unit: hour
          requests_per_unit: 1
        shadow_mode: true
  - key: internal
    rate_limit:
      unlimited: true
  - key: vip
    rate_limit:
      name: vip
      unit: second
      requests_per_unit: 100
      replaces:
        - name: per_user
  - key: closed
    rate_limit:
      unit: day
      requests_per_unit: 0
`

// TestEnvoyLimitsFile: limits come from the limits file for descriptors
// that carry none: nested descriptors, unlimited, shadow mode, replaces and
// a limit of 0.
func TestEnvoyLimitsFile(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, nil)
	ec := newEnvoyClient(ts)
	steps := []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		want string
	}{
		{"key-only default", rd("remote_address", "10.0.0.1"), "OK 3/MINUTE r=2 reset=1m0s"},
		{"each value its own counter", rd("remote_address", "10.0.0.2"), "OK 3/MINUTE r=2 reset=1m0s"},
		{"an empty value is a value", rd("remote_address", ""), "OK 3/MINUTE r=2 reset=1m0s"},
		{"nested", rd("service", "auth", "user", "bob"), "OK 2/SECOND per_user r=1 reset=1s"},
		{"nested again", rd("service", "auth", "user", "bob"), "OK 2/SECOND per_user r=0 reset=1s"},
		{"nested over", rd("service", "auth", "user", "bob"), "OVER_LIMIT 2/SECOND per_user r=0 reset=1s"},
		{"deeper than the tree", rd("service", "auth", "user", "bob", "x", "y"), "OK r=0"},
		{"unknown value", rd("service", "billing", "user", "bob"), "OK r=0"},
		{"unknown domain", rd("remote_address", "10.0.0.1"), "OK r=0"},
		{"unlimited", rd("internal", "x"), "OK r=4294967295"},
		{"limit 0 blocks", rd("closed", "x"), "OVER_LIMIT 0/DAY r=0 reset=24h0m0s"},
		{"shadow allowed", rd("service", "auth", "tier", "free"), "OK 1/HOUR free_tier r=0 reset=1h0m0s"},
		{"shadow over: reported OK", rd("service", "auth", "tier", "free"), "OK 1/HOUR free_tier r=0 reset=1h0m0s"},
		{"inline limit beats the file", inline(rd("remote_address", "10.0.0.9"), 50, typev3.RateLimitUnit_SECOND, 0), "OK 50/SECOND r=49 reset=1s"},
	}
	for _, st := range steps {
		domain := "edge"
		if st.name == "unknown domain" {
			domain = "other"
		}
		if got := ec.one(domain, st.d); got != st.want {
			t.Errorf("%s: ShouldRateLimit(%s, %v) = %s; want %s", st.name, domain, st.d.Entries, got, st.want)
		}
	}
	if got := decisions(t, ts.srv, "shadow_denied"); got != 1 {
		t.Errorf("decisions{envoy,shadow_denied} = %v; want 1", got)
	}

	// A shadow denial never fails the request; an enforced one does.
	resp := ec.call("edge", 0, rd("service", "auth", "tier", "free"), rd("remote_address", "10.0.0.3"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("shadow over + enforced OK: overall %v; want OK", resp.OverallCode)
	}

	// replaces: vip drops per_user from requests that match both.
	ts.clk.Advance(time.Second) // per_user for bob is whole again
	resp = ec.call("edge", 0, rd("service", "auth", "user", "bob"), rd("vip", "gold"))
	if got, want := summary(resp.Statuses[0]), "OK r=0"; got != want {
		t.Errorf("per_user replaced by vip: %s; want %s", got, want)
	}
	if got, want := summary(resp.Statuses[1]), "OK 100/SECOND vip r=99 reset=1s"; got != want {
		t.Errorf("vip: %s; want %s", got, want)
	}
	if got, want := ec.one("edge", rd("service", "auth", "user", "bob")), "OK 2/SECOND per_user r=1 reset=1s"; got != want {
		t.Errorf("per_user alone after the vip request: %s; want %s (the replaced rule counted nothing)", got, want)
	}
}

// TestEnvoyNativeSharesEnvoyKeys: a native check on an encoded Envoy key
// takes its limit from the limits file and shares the Envoy counter.
func TestEnvoyNativeSharesEnvoyKeys(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, nil)
	ec := newEnvoyClient(ts)
	ec.one("edge", rd("remote_address", "10.1.1.1"))
	ec.one("edge", rd("remote_address", "10.1.1.1"))
	key := envoyKey("edge", entries("remote_address", "10.1.1.1"))
	native := sluicepb.NewRateLimitServiceClient(ts.conn)
	cost := int64(0)
	resp, err := native.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{Key: []byte(key), Cost: &cost}}})
	if err != nil {
		t.Fatalf("native peek at %q: %v", key, err)
	}
	if d := resp.Decisions[0]; d.Limit != 3 || d.Remaining != 1 {
		t.Errorf("native peek at %q = limit %d, remaining %d; want 3 and 1", key, d.Limit, d.Remaining)
	}
	if ts.srv.limitsRuleForKey("edge|remote_address") != nil || ts.srv.limitsRuleForKey("not an envoy key") != nil {
		t.Error("limitsRuleForKey found a rule for a key that is not a valid Envoy key")
	}
}

// TestEnvoyLimitsReloadUnderTraffic: reloading the limits file while
// requests flow fails none of them; the new limits apply after the reload;
// a broken file keeps the previous limits.
func TestEnvoyLimitsReloadUnderTraffic(t *testing.T) {
	version := func(busy, fresh int) string {
		return fmt.Sprintf(`
domain: edge
descriptors:
  - key: route
    value: busy
    rate_limit:
      unit: minute
      requests_per_unit: %d
  - key: route
    value: fresh
    rate_limit:
      unit: minute
      requests_per_unit: %d
`, busy, fresh)
	}
	ts, path := newLimitsServer(t, version(1_000_000, 100), nil)
	ec := newEnvoyClient(ts)

	var calls, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := ec.try(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rd("route", "busy")}})
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				calls.Add(1)
			}
		}()
	}
	// waitCalls waits until n more calls have completed.
	waitCalls := func(n int64) {
		target := calls.Load() + n
		testkit.Eventually(t, 20*time.Second, func() bool { return calls.Load() >= target }, "%d calls (traffic stalled)", target)
	}
	waitCalls(50)
	for i := range 5 {
		writeLimits(t, path, version(1_000_000-i, 2))
		if err := ts.srv.limits.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		waitCalls(20)
	}
	writeLimits(t, path, "domain: edge\ndescriptors:\n  - key: route\n    rate_limit: {unit: fortnight")
	if err := ts.srv.limits.Reload(); err == nil {
		t.Fatal("Reload of a broken file succeeded")
	}
	waitCalls(20)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed during reloads; first: %v", n, calls.Load(), firstErr.Load())
	}
	want := []string{"OK 2/MINUTE r=1 reset=1m0s", "OK 2/MINUTE r=0 reset=1m0s", "OVER_LIMIT 2/MINUTE r=0 reset=1m0s"}
	for i, w := range want {
		if got := ec.one("edge", rd("route", "fresh")); got != w {
			t.Errorf("after the reloads and a refused change, call %d on route=fresh: %s; want %s", i, got, w)
		}
	}
	if got, want := ec.call("edge", 0, hits(rd("route", "busy"), 0)).Statuses[0].CurrentLimit.GetRequestsPerUnit(), uint32(1_000_000-4); got != want {
		t.Errorf("route=busy limit after the reloads = %d; want %d", got, want)
	}
}

// setOverride sets an override directly in the node's table.
func setOverride(t *testing.T, ts *testServer, o *overrides.Override) {
	t.Helper()
	if err := ts.srv.overrides.Set(o, ts.clk.Now()); err != nil {
		t.Fatalf("set override %+v: %v", o, err)
	}
}

// TestEnvoyOverrides: an admin override on a descriptor's key wins over the
// inline limit and the limits file, and can limit a descriptor that has
// none.
func TestEnvoyOverrides(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, nil)
	ec := newEnvoyClient(ts)
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("user", "alice")), Limit: 2})
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("remote_address", "10.9.9.9")), Limit: 1})
	setOverride(t, ts, &overrides.Override{Key: "edge|team=", Prefix: true, Limit: 1, Window: time.Hour})
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("odd", "window")), Limit: 5, Window: 90 * time.Second})
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("subsecond", "window")), Limit: 5, Window: 1500 * time.Millisecond})
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("half", "only")), Limit: 5}) // no window, no rule
	steps := []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		want string
	}{
		{"beats the inline limit", inline(rd("user", "alice"), 10, typev3.RateLimitUnit_MINUTE, 0), "OK 2/MINUTE r=1 reset=1m0s"},
		{"beats the inline limit, over", inline(rd("user", "alice"), 10, typev3.RateLimitUnit_MINUTE, 0), "OK 2/MINUTE r=0 reset=1m0s"},
		{"beats the inline limit, over", inline(rd("user", "alice"), 10, typev3.RateLimitUnit_MINUTE, 0), "OVER_LIMIT 2/MINUTE r=0 reset=1m0s"},
		{"beats the file", rd("remote_address", "10.9.9.9"), "OK 1/MINUTE r=0 reset=1m0s"},
		{"beats the file, over", rd("remote_address", "10.9.9.9"), "OVER_LIMIT 1/MINUTE r=0 reset=1m0s"},
		{"prefix limits a descriptor without a limit", rd("team", "red"), "OK 1/HOUR r=0 reset=1h0m0s"},
		{"prefix, another value", rd("team", "blue", "user", "x"), "OK 1/HOUR r=0 reset=1h0m0s"},
		{"window of 90s", rd("odd", "window"), "OK 5/SECONDx90 r=4 reset=1m30s"},
		{"window of 1.5s shows as 2s", rd("subsecond", "window"), "OK 5/SECONDx2 r=4 reset=1.5s"},
		{"a limit without a window limits nothing", rd("half", "only"), "OK r=0"},
	}
	for _, st := range steps {
		if got := ec.one("edge", st.d); got != st.want {
			t.Errorf("%s: ShouldRateLimit(%v) = %s; want %s", st.name, st.d.Entries, got, st.want)
		}
	}

	// An override the engine cannot apply fails the request, naming the
	// descriptor.
	setOverride(t, ts, &overrides.Override{Key: envoyKey("edge", entries("bad", "override")), Limit: 1, Window: 20 * 365 * 24 * time.Hour})
	_, err := ec.try(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{rd("path", "/"), rd("bad", "override")}})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "descriptor 1 (key edge|bad=override): window") {
		t.Errorf("descriptor with a 20-year override window: %v; want InvalidArgument naming descriptor 1 and its window", err)
	}
}

// TestEnvoyResponseHeaders: with RateLimitHeaders, responses carry the
// RateLimit-Policy and RateLimit fields of the most restrictive descriptor,
// and Retry-After when over the limit; without it, none.
func TestEnvoyResponseHeaders(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, func(c *testConfig) { c.RateLimitHeaders = true })
	ec := newEnvoyClient(ts)
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
	steps := []struct {
		name    string
		advance time.Duration
		ds      []*ratelimitv3.RateLimitDescriptor
		want    string
	}{
		{"first hit", 0, []*ratelimitv3.RateLimitDescriptor{route()},
			"RateLimit-Policy: \"default\";q=2;w=60\nRateLimit: \"default\";r=1;t=60"},
		{"the fewest remaining wins", 20 * time.Second, []*ratelimitv3.RateLimitDescriptor{rd("remote_address", "1.1.1.1"), route()},
			"RateLimit-Policy: \"default\";q=2;w=60\nRateLimit: \"default\";r=0;t=60"},
		{"over: Retry-After", 10 * time.Second, []*ratelimitv3.RateLimitDescriptor{rd("remote_address", "1.1.1.1"), route()},
			"RateLimit-Policy: \"default\";q=2;w=60\nRateLimit: \"default\";r=0;t=30\nRetry-After: 30"},
		{"named rule", 0, []*ratelimitv3.RateLimitDescriptor{rd("service", "auth", "user", "u")},
			"RateLimit-Policy: \"per_user\";q=2;w=1\nRateLimit: \"per_user\";r=1;t=1"},
		{"the longest wait wins", 0, []*ratelimitv3.RateLimitDescriptor{hits(rd("service", "auth", "user", "u"), 2), route()},
			"RateLimit-Policy: \"default\";q=2;w=60\nRateLimit: \"default\";r=0;t=30\nRetry-After: 30"},
		{"never fits: no Retry-After", 0, []*ratelimitv3.RateLimitDescriptor{route(), rd("closed", "x")},
			"RateLimit-Policy: \"default\";q=0;w=86400\nRateLimit: \"default\";r=0;t=86400"},
		{"shadow never shows", 0, []*ratelimitv3.RateLimitDescriptor{rd("service", "auth", "tier", "free"), rd("service", "auth", "tier", "free")},
			""},
		{"no limit, no headers", 0, []*ratelimitv3.RateLimitDescriptor{rd("path", "/")}, ""},
	}
	for _, st := range steps {
		ts.clk.Advance(st.advance)
		resp := ec.call("edge", 0, st.ds...)
		if got := headers(resp); got != st.want {
			t.Errorf("%s: headers\n%s\nwant\n%s", st.name, got, st.want)
		}
	}

	plain := newTestServer(t, nil)
	if resp := newEnvoyClient(plain).call("edge", 0, route()); len(resp.ResponseHeadersToAdd) != 0 {
		t.Errorf("without RateLimitHeaders: headers %v; want none", resp.ResponseHeadersToAdd)
	}
}

// TestEnvoyBadInput: every malformed request gets InvalidArgument with a
// message that says what to change, and records nothing, even for its good
// descriptors.
func TestEnvoyBadInput(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	good := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("route", "good"), 10, typev3.RateLimitUnit_MINUTE, 0)
	}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string // part of the message
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{good()}}, "domain"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}, "descriptor"},
		{"descriptor without entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), {}}}, "descriptor 1 has no entries"},
		{"entry with an empty key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), rd("a", "b", "", "c")}}, "entry 1: the key is empty"},
		{"unit UNKNOWN", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", "v"), 5, typev3.RateLimitUnit_UNKNOWN, 0)}}, "unit"},
		{"unit out of the enum", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", "v"), 5, 42, 0)}}, "unit"},
		{"unit_multiplier 0", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), func() *ratelimitv3.RateLimitDescriptor {
			d := inline(rd("k", "v"), 5, typev3.RateLimitUnit_SECOND, 0)
			d.Limit.UnitMultiplier = wrapperspb.UInt32(0)
			return d
		}()}}, "unit_multiplier"},
		{"window too long", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", "v"), 5, typev3.RateLimitUnit_YEAR, 11)}}, "longest window"},
		{"huge multiplier", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", "v"), 5, typev3.RateLimitUnit_YEAR, 1<<32-1)}}, "longest window"},
		{"key too long", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", strings.Repeat("v", 1100)), 5, typev3.RateLimitUnit_SECOND, 0)}}, "maximum of 1024"},
		{"key too long once escaped", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), inline(rd("k", strings.Repeat("|", 400)), 5, typev3.RateLimitUnit_SECOND, 0)}}, "maximum of 1024"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: func() []*ratelimitv3.RateLimitDescriptor {
			ds := make([]*ratelimitv3.RateLimitDescriptor, 1001)
			for i := range ds {
				ds[i] = good()
			}
			return ds
		}()}, "maximum is 1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := ec.try(tt.req)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("ShouldRateLimit(%s) = %v, %v; want InvalidArgument mentioning %q", tt.name, resp, err, tt.msg)
			}
		})
	}
	if got, want := ec.one("edge", hits(good(), 0)), "OK 10/MINUTE r=10 reset=0s"; got != want {
		t.Errorf("peek at the good descriptor after the refused requests: %s; want %s (nothing recorded)", got, want)
	}
	if got := decisions(t, ts.srv, "error"); got < float64(len(tests)) {
		t.Errorf("decisions{envoy,error} = %v; want at least %d", got, len(tests))
	}
}

// TestWindowUnit: the representation of override windows in current_limit.
func TestWindowUnit(t *testing.T) {
	tests := []struct {
		w        time.Duration
		wantUnit rlsv3.RateLimitResponse_RateLimit_Unit
		wantMult uint32
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		{time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		{1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{2 * time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 2},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 1},
		{36 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 36},
		{14 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK, 2},
		{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH, 1},
		{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR, 1},
		{3650 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR, 10},
	}
	for _, tt := range tests {
		u, m := windowUnit(tt.w)
		if got := rlsv3.RateLimitResponse_RateLimit_Unit(u); got != tt.wantUnit || m != tt.wantMult {
			t.Errorf("windowUnit(%v) = %v × %d; want %v × %d", tt.w, got, m, tt.wantUnit, tt.wantMult)
		}
	}
}

// TestEnvoyQuotaModeAndSharedKeys: quota-mode descriptors fail a request
// only when all of them are over their limit (as in envoyproxy/ratelimit);
// a share_threshold rule counts every value its pattern matches under one
// key.
func TestEnvoyQuotaModeAndSharedKeys(t *testing.T) {
	ts, _ := newLimitsServer(t, `
domain: edge
descriptors:
  - key: quota_a
    rate_limit:
      unit: minute
      requests_per_unit: 1
    quota_mode: true
  - key: quota_b
    rate_limit:
      unit: minute
      requests_per_unit: 2
    quota_mode: true
  - key: file
    value: files/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
`, nil)
	ec := newEnvoyClient(ts)
	codes := func(resp *rlsv3.RateLimitResponse) string {
		s := resp.OverallCode.String() + ":"
		for _, st := range resp.Statuses {
			s += " " + st.Code.String()
		}
		return s
	}
	for i, want := range []string{
		"OK: OK OK",
		"OK: OVER_LIMIT OK",                 // one quota over: the request passes
		"OVER_LIMIT: OVER_LIMIT OVER_LIMIT", // both over: it fails
	} {
		if got := codes(ec.call("edge", 0, rd("quota_a", "x"), rd("quota_b", "x"))); got != want {
			t.Errorf("quota request %d: %s; want %s", i, got, want)
		}
	}

	ec.one("edge", rd("file", "files/a.txt"))
	if got, want := ec.one("edge", rd("file", "files/b.txt")), "OK 2/MINUTE r=0 reset=1m0s"; got != want {
		t.Errorf("second file under a shared pattern: %s; want %s", got, want)
	}
	key := envoyKey("edge", entries("file", "files/*"))
	if st, err := ts.srv.engine.Inspect(ts.ctx(), key); err != nil || st.Remaining != 0 {
		t.Errorf("Inspect(%q) = %+v, %v; want the shared counter with 0 remaining", key, st, err)
	}
}
