package api

import (
	"bytes"
	"strings"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestEnvoyUsageDescriptors: a usage descriptor (a limits file rule with
// usage: true, or any descriptor of a --usage-domain, inline limits
// included) records every report, a cost above the limit too, says
// OVER_LIMIT when it does not fit, and its cost-0 checks are OVER_LIMIT
// while the key is at or above its limit. The same descriptors without
// usage drop the report (envoyproxy/ratelimit's behaviour is the usage
// one).
func TestEnvoyUsageDescriptors(t *testing.T) {
	ts, _ := newLimitsServer(t, `
domain: ai
descriptors:
  - key: user
    usage: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1000}
`, func(c *testConfig) { c.UsageDomains = []string{"llm"} })
	ec := newEnvoyClient(ts)
	for _, tc := range []struct {
		name   string
		domain string
		d      func(hits uint64) string
	}{
		{"limits file usage", "ai", func(n uint64) string { return ec.one("ai", hits(rd("user", "u1"), n)) }},
		{"usage domain, inline limit", "llm", func(n uint64) string {
			return ec.one("llm", hits(inline(rd("user", "u1"), 1000, typev3.RateLimitUnit_MINUTE, 0), n))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, step := range []struct {
				hits uint64
				want string
			}{
				{900, "OK 1000/MINUTE r=100 reset=1m0s"},
				{0, "OK 1000/MINUTE r=100 reset=1m0s"},
				// The report: 500 with 100 left. Recorded.
				{500, "OVER_LIMIT 1000/MINUTE r=0 reset=1m0s"},
				{0, "OVER_LIMIT 1000/MINUTE r=0 reset=1m0s"},
				// A report above the limit is recorded too, not refused.
				{5000, "OVER_LIMIT 1000/MINUTE r=0 reset=1m0s"},
			} {
				if got := tc.d(step.hits); got != step.want {
					t.Fatalf("hits %d: %s; want %s", step.hits, got, step.want)
				}
			}
		})
	}
	// At exactly the limit: a usage check of cost 0 is over; a plain one
	// is not.
	ec.one("ai", hits(rd("user", "u2"), 1000))
	if got, want := ec.one("ai", hits(rd("user", "u2"), 0)), "OVER_LIMIT 1000/MINUTE r=0 reset=1m0s"; got != want {
		t.Errorf("usage key at its limit, cost 0: %s; want %s", got, want)
	}
	ec.one("ai", hits(rd("plain", "p"), 1000))
	if got, want := ec.one("ai", hits(rd("plain", "p"), 0)), "OK 1000/MINUTE r=0 reset=1m0s"; got != want {
		t.Errorf("plain key at its limit, cost 0: %s; want %s", got, want)
	}
	// Without usage, a report that does not fit is dropped.
	ec.one("ai", hits(rd("plain", "q"), 900))
	ec.one("ai", hits(rd("plain", "q"), 500))
	if got, want := ec.one("ai", hits(rd("plain", "q"), 0)), "OK 1000/MINUTE r=100 reset=1m0s"; got != want {
		t.Errorf("plain key after a denied 500: %s; want %s", got, want)
	}
	var m dto.Metric
	if err := ts.srv.metrics.usage.reports.WithLabelValues("envoy").Write(&m); err != nil || m.GetCounter().GetValue() != 7 {
		t.Errorf("sluice_usage_reports_total{api=envoy} = %v, %v; want 7", m.GetCounter().GetValue(), err)
	}
}

// TestNativeReserveSettle: a reserve returns a handle when allowed (and
// none when denied); Settle gives back the difference or records the
// overshoot, once; bad handles and costs are INVALID_ARGUMENT and change
// nothing; a settle never gives back more than was reserved.
func TestNativeReserveSettle(t *testing.T) {
	ts := newTestServer(t, nil)
	c := sluicepb.NewRateLimitServiceClient(ts.conn)
	reserve := func(key string, est int64) *sluicepb.Decision {
		t.Helper()
		pc := nativeCheck(key, 1000, time.Minute, est)
		pc.ReserveFor = durationpb.New(30 * time.Second)
		resp, err := c.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{pc}})
		if err != nil {
			t.Fatalf("reserve %d on %s: %v", est, key, err)
		}
		return resp.Decisions[0]
	}
	settle := func(handle []byte, cost int64) (*sluicepb.SettleResult, error) {
		resp, err := c.Settle(ts.ctx(), &sluicepb.SettleRequest{Settlements: []*sluicepb.Settlement{{Reservation: handle, Cost: cost}}})
		if err != nil {
			return nil, err
		}
		return resp.Results[0], nil
	}
	remaining := func(key string) int64 {
		t.Helper()
		resp, err := c.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 1000, time.Minute, 0)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Decisions[0].Remaining
	}

	d := reserve("k", 600)
	if !d.Allowed || len(d.Reservation) == 0 || d.Remaining != 400 {
		t.Fatalf("reserve 600 of 1000 = %v; want allowed, a handle, 400 remaining", d)
	}
	if d2 := reserve("k", 600); d2.Allowed || len(d2.Reservation) != 0 {
		t.Fatalf("reserve 600 with 400 left = %v; want denied, no handle", d2)
	}
	for _, bad := range []struct {
		name   string
		handle []byte
		cost   int64
	}{
		{"empty handle", nil, 1},
		{"truncated handle", d.Reservation[:10], 1},
		{"unknown version", append([]byte{9}, d.Reservation[1:]...), 1},
		{"negative cost", d.Reservation, -1},
	} {
		if _, err := settle(bad.handle, bad.cost); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Settle(%s) = %v; want InvalidArgument", bad.name, err)
		}
	}
	forged := bytes.Clone(d.Reservation)
	forged[5] ^= 1 // another ID: nobody's reservation
	if r, err := settle(forged, 0); err != nil || r.Settled {
		t.Errorf("Settle(a forged handle) = %v, %v; want not settled", r, err)
	}
	if got := remaining("k"); got != 400 {
		t.Fatalf("after refused settles, %d remaining; want 400 (nothing changed)", got)
	}
	if r, err := settle(d.Reservation, 250); err != nil || !r.Settled || r.Returned != 350 || r.Remaining != 750 {
		t.Fatalf("Settle(600 at 250) = %v, %v; want settled, 350 returned, 750 remaining", r, err)
	}
	if r, err := settle(d.Reservation, 0); err != nil || r.Settled || r.Remaining != 750 {
		t.Fatalf("Settle again = %v, %v; want not settled, 750 remaining", r, err)
	}
	d = reserve("k", 500)
	if r, err := settle(d.Reservation, 2000); err != nil || !r.Settled || r.Overshoot != 1500 || r.Remaining != 0 || r.RetryAfter.AsDuration() == 0 {
		t.Fatalf("Settle(500 at 2000) = %v, %v; want settled, 1500 overshoot, nothing remaining, a wait", r, err)
	}
}

// TestNativeUsageBadInput: the fields of usage and reservations refuse
// what cannot work, with INVALID_ARGUMENT, recording nothing.
func TestNativeUsageBadInput(t *testing.T) {
	ts := newTestServer(t, nil)
	c := sluicepb.NewRateLimitServiceClient(ts.conn)
	with := func(f func(*sluicepb.Check)) *sluicepb.Check {
		pc := nativeCheck("x", 10, time.Minute, 1)
		f(pc)
		return pc
	}
	for _, tc := range []struct {
		name string
		req  *sluicepb.CheckRequest
	}{
		{"reservation_id from a client", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.ReservationId = []byte("0123456789abcdef") })}}},
		{"settle from a client", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Settle = true })}}},
		{"usage refund", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Usage, pc.Refund = true, true })}}},
		{"usage reserve", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Usage, pc.ReserveFor = true, durationpb.New(time.Second) })}}},
		{"negative reserve_for", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.ReserveFor = durationpb.New(-time.Second) })}}},
		{"reserve_for too long", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.ReserveFor = durationpb.New(4000 * 24 * time.Hour) })}}},
		{"reserve nothing", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.ReserveFor, pc.Cost = durationpb.New(time.Second), new(int64) })}}},
		{"lease without reserve_for", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Lease = true })}}},
		{"lease on a sliding window", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) {
			pc.Lease, pc.ReserveFor, pc.Algorithm = true, durationpb.New(time.Second), sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW
		})}}},
		{"holder without reserve_for", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Holder = "web-1" })}}},
		{"holder too long", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) {
			pc.Lease, pc.ReserveFor, pc.Holder = true, durationpb.New(time.Second), strings.Repeat("h", 129)
		})}}},
		{"demand without reserve_for", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) { pc.Demand = 10 })}}},
		{"demand without a lease", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) {
			pc.ReserveFor, pc.Holder, pc.Demand = durationpb.New(time.Second), "web-1", 10
		})}}},
		{"demand without a holder", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) {
			pc.Lease, pc.ReserveFor, pc.Demand = true, durationpb.New(time.Second), 10
		})}}},
		{"negative demand", &sluicepb.CheckRequest{Checks: []*sluicepb.Check{with(func(pc *sluicepb.Check) {
			pc.Lease, pc.ReserveFor, pc.Holder, pc.Demand = true, durationpb.New(time.Second), "web-1", -1
		})}}},
		{"usage report in all_or_nothing", &sluicepb.CheckRequest{AllOrNothing: true, Checks: []*sluicepb.Check{nativeCheck("y", 10, time.Minute, 1), with(func(pc *sluicepb.Check) { pc.Usage = true })}}},
	} {
		if _, err := c.Check(ts.ctx(), tc.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: Check = %v; want InvalidArgument", tc.name, err)
		}
	}
	for _, key := range []string{"x", "y"} {
		resp, err := c.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 10, time.Minute, 0)}})
		if err != nil || resp.Decisions[0].Remaining != 10 {
			t.Errorf("peek at %s after refused calls = %v, %v; want 10 remaining", key, resp, err)
		}
	}
	// A usage report above the limit is valid, and recorded.
	pc := nativeCheck("z", 10, time.Minute, 25)
	pc.Usage = true
	resp, err := c.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{pc}})
	if err != nil || resp.Decisions[0].Allowed || resp.Decisions[0].Remaining != 0 || resp.Decisions[0].RetryAfter.AsDuration() != time.Minute {
		t.Errorf("usage report of 25 on a limit of 10 = %v, %v; want recorded and denied, a minute's wait", resp, err)
	}
}
