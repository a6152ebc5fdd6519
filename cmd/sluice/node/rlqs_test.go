package node

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// simEnvoy behaves as Envoy's rate limit quota filter does for one bucket:
// a token bucket per assignment (whole-second fills), kept when the same
// assignment comes again (only its TTL moves), replaced by a full one when
// it changes; no assignment, or an expired one, denies (the configuration
// docs/envoy.md gives for exactness); a usage report every second.
type simEnvoy struct {
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	id     *rlqsv3.BucketId
	demand float64 // requests a second

	strategy *typev3.RateLimitStrategy
	expires  time.Time
	tokens   float64
	filled   time.Time // the bucket's last fill
	owed     float64   // requests not yet sent (fractions)

	allowed, denied uint64 // since the last report
	admitted        []time.Time
	rate            int64 // the rate assigned last
}

// tick offers the requests of dt at now.
func (e *simEnvoy) tick(now time.Time, dt time.Duration) {
	e.owed += e.demand * dt.Seconds()
	for ; e.owed >= 1; e.owed-- {
		tb := e.strategy.GetTokenBucket()
		_, blanket := e.strategy.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
		switch {
		case e.strategy == nil || !now.Before(e.expires):
			e.denied++
			continue
		case blanket && e.strategy.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL:
			e.allowed++
			e.admitted = append(e.admitted, now)
			continue
		case tb == nil:
			e.denied++
			continue
		}
		fill := tb.GetFillInterval().AsDuration()
		for !now.Before(e.filled.Add(fill)) {
			e.filled = e.filled.Add(fill)
			e.tokens = min(float64(tb.GetMaxTokens()), e.tokens+float64(tb.GetTokensPerFill().GetValue()))
		}
		if e.tokens >= 1 {
			e.tokens--
			e.allowed++
			e.admitted = append(e.admitted, now)
		} else {
			e.denied++
		}
	}
}

// report sends the usage of the last elapsed and applies the answer.
func (e *simEnvoy) report(t *testing.T, now time.Time, first bool, elapsed time.Duration) {
	t.Helper()
	m := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: e.id, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied,
	}}}
	if first {
		m.Domain = "quota"
	}
	e.allowed, e.denied = 0, 0
	if err := e.stream.Send(m); err != nil {
		t.Fatalf("send a usage report: %v", err)
	}
	resp, err := e.stream.Recv()
	if err != nil {
		t.Fatalf("receive the assignment: %v", err)
	}
	for _, a := range resp.BucketAction {
		q := a.GetQuotaAssignmentAction()
		if q == nil {
			continue
		}
		if !proto.Equal(q.RateLimitStrategy, e.strategy) {
			e.strategy = q.RateLimitStrategy
			e.tokens, e.filled = float64(q.RateLimitStrategy.GetTokenBucket().GetMaxTokens()), now
			e.rate = int64(q.RateLimitStrategy.GetTokenBucket().GetTokensPerFill().GetValue())
		}
		e.expires = now.Add(q.AssignmentTimeToLive.AsDuration())
	}
}

// TestRLQSFairAndExact: three simulated Envoys on one node of a cluster,
// demands of 1000, 700 and 100 requests a second (and 10:3:1, 1000, 300
// and 100) on one bucket whose rule allows 61,000 a minute. The Σ rule
// leaves 1,000 a second to divide (each assignment counts its burst and a
// window of its rate); max-min fair is 450, 450 and 100 (600, 300 and
// 100). After two report periods each Envoy's rate is within 10% of it;
// every minute of the fake clock admits at most the limit across the
// three; an Envoy that goes silent gives its share back to the others
// once its assignment's lease has run out (a window after it).
func TestRLQSFairAndExact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		demand, want []int64
	}{
		{"1000-700-100", []int64{1000, 700, 100}, []int64{450, 450, 100}},
		{"10-3-1", []int64{1000, 300, 100}, []int64{600, 300, 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rlqsFairAndExact(t, tc.demand, tc.want)
		})
	}
}

// rlqsFairAndExact runs TestRLQSFairAndExact with three Envoys of demand,
// whose max-min fair shares are want.
func rlqsFairAndExact(t *testing.T, demand, want []int64) {
	const limit, window = rlqsLimit, time.Minute
	tc := rlqsCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var envoys []*simEnvoy
	for _, d := range demand {
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(tc.nodes[0].conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		envoys = append(envoys, &simEnvoy{stream: stream, demand: float64(d),
			id: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}})
	}
	const step = 10 * time.Millisecond
	start := tc.clk.Now()
	for i := 0; i < 16000; i++ { // 160 s
		now := tc.clk.Now()
		if i%100 == 0 {
			for j, e := range envoys {
				if j == 0 && i >= 8000 {
					continue // the largest goes silent at 80 s
				}
				e.report(t, now, i == 0, time.Second)
			}
			if i%1000 == 0 {
				t.Logf("%v: rates %d, %d, %d", now.Sub(start), envoys[0].rate, envoys[1].rate, envoys[2].rate)
			}
			if i == 300 {
				t.Logf("after two report periods: rates %d, %d, %d", envoys[0].rate, envoys[1].rate, envoys[2].rate)
				for j, e := range envoys {
					if math.Abs(float64(e.rate-want[j])) > 0.1*float64(want[j]) {
						t.Errorf("after two report periods, envoy %d (demand %.0f) holds %d a second; want %d ± 10%% (max-min fair)", j, e.demand, e.rate, want[j])
					}
				}
			}
		}
		for j, e := range envoys {
			if j == 0 && i >= 8000 {
				continue
			}
			e.tick(now, step)
		}
		tc.clk.Advance(step)
	}
	most := mostInWindow(envoys, window)
	t.Logf("over %v: admitted %d, %d, %d; at most %d within one window (limit %d); rates at the end %d, %d, %d",
		tc.clk.Now().Sub(start), len(envoys[0].admitted), len(envoys[1].admitted), len(envoys[2].admitted), most, limit, envoys[0].rate, envoys[1].rate, envoys[2].rate)
	if most > limit {
		t.Fatalf("%d requests admitted within one window across the Envoys; want at most the limit %d", most, limit)
	}
	if float64(envoys[1].rate) < 0.9*float64(demand[1]) || float64(envoys[2].rate) < 0.9*float64(demand[2]) {
		t.Errorf("at the end the second and third hold %d and %d a second; want their whole demand (%d, %d) within 10%% once the first went silent", envoys[1].rate, envoys[2].rate, demand[1], demand[2])
	}
}

// TestRLQSAcrossNodes: two simulated Envoys on two nodes, each asking for
// the whole rate of one bucket. Each node alone would give its Envoy all
// of it; the leases on the key hold the two together to the limit in
// every window, and the fair shares the key's owner reports with them
// divide it equally.
func TestRLQSAcrossNodes(t *testing.T) {
	t.Parallel()
	const limit, window = rlqsLimit, time.Minute
	tc := rlqsCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var envoys []*simEnvoy
	for i := range 2 {
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(tc.nodes[i].conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		envoys = append(envoys, &simEnvoy{stream: stream, demand: 1500, id: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}})
	}
	const step = 10 * time.Millisecond
	for i := 0; i < 15000; i++ { // 150 s
		now := tc.clk.Now()
		if i%100 == 0 {
			for _, e := range envoys {
				e.report(t, now, i == 0, time.Second)
			}
		}
		for _, e := range envoys {
			e.tick(now, step)
		}
		tc.clk.Advance(step)
	}
	most := mostInWindow(envoys, window)
	t.Logf("admitted %d and %d; at most %d within one window (limit %d); rates at the end %d and %d", len(envoys[0].admitted), len(envoys[1].admitted), most, limit, envoys[0].rate, envoys[1].rate)
	if most > limit {
		t.Fatalf("%d requests admitted within one window across the Envoys; want at most the limit %d", most, limit)
	}
	if envoys[0].rate+envoys[1].rate < 500 {
		t.Errorf("rates %d and %d: want the key's rate (1,000 a second) mostly used", envoys[0].rate, envoys[1].rate)
	}
	// The key's owner hears both nodes' buckets: equal demands, equal
	// shares (max-min), within 10%.
	if hi, lo := max(envoys[0].rate, envoys[1].rate), min(envoys[0].rate, envoys[1].rate); float64(lo) < 0.9*float64(hi) {
		t.Errorf("rates %d and %d for equal demands on two nodes; want them within 10%% of each other (max-min fair across nodes)", envoys[0].rate, envoys[1].rate)
	}
}

// TestRLQSLateJoiner: an Envoy wanting 1,500 a second holds the whole
// key alone for 30 s; then a second one, wanting 200, joins, on the same
// node or on another. The first must give way although the key has no
// room left but the headroom the Σ rule keeps (limit / (window + 2
// fills)): it lowers its rate (its new bucket's burst comes from the
// headroom), and once its old assignment can admit in no window (a
// window and a TTL later), the second gets its whole demand. Across nodes
// it is the key's owner that tells the first of the second, through the
// fair share it reports with each lease. No window admits more than the
// limit.
func TestRLQSLateJoiner(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"same-node", "across-nodes"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			const limit, window = rlqsLimit, time.Minute
			tc := rlqsCluster(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var envoys []*simEnvoy
			for i, d := range []float64{1500, 200} {
				n := 0
				if where == "across-nodes" {
					n = i
				}
				stream, err := rlqsv3.NewRateLimitQuotaServiceClient(tc.nodes[n].conn).StreamRateLimitQuotas(ctx)
				if err != nil {
					t.Fatal(err)
				}
				envoys = append(envoys, &simEnvoy{stream: stream, demand: d, id: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}})
			}
			const step = 10 * time.Millisecond
			start := tc.clk.Now()
			var served time.Duration     // when the second first held 90% of its demand
			for i := 0; i < 20000; i++ { // 200 s; the second joins at 30 s
				now := tc.clk.Now()
				joined := i >= 3000
				if i%100 == 0 {
					envoys[0].report(t, now, i == 0, time.Second)
					if joined {
						envoys[1].report(t, now, i == 3000, time.Second)
						if served == 0 && envoys[1].rate >= 180 {
							served = now.Sub(start) - 30*time.Second
						}
					}
					if i%2000 == 0 {
						t.Logf("%v: rates %d and %d", now.Sub(start), envoys[0].rate, envoys[1].rate)
					}
				}
				envoys[0].tick(now, step)
				if joined {
					envoys[1].tick(now, step)
				}
				tc.clk.Advance(step)
			}
			most := mostInWindow(envoys, window)
			t.Logf("the second held its demand %v after it joined; at most %d within one window (limit %d); rates at the end %d and %d", served, most, limit, envoys[0].rate, envoys[1].rate)
			if most > limit {
				t.Fatalf("%d requests admitted within one window; want at most the limit %d", most, limit)
			}
			if envoys[1].rate < 180 {
				t.Fatalf("the late Envoy holds %d a second at the end; want its demand, 200, within 10%%", envoys[1].rate)
			}
			if envoys[0].rate+envoys[1].rate < 850 {
				t.Errorf("rates %d and %d: want most of the key's 983 a second used", envoys[0].rate, envoys[1].rate)
			}
		})
	}
}

// TestRLQSSilentThenBack: an Envoy holding 500 a second goes silent for
// 70 s, past its assignment's lease and the window its hits count after
// it; meanwhile another caller takes most of the key's room with plain
// checks. When the Envoy reports again, the lease
// its assignment needs cannot be had whole: the assignment must not be
// sent again on part of one (Envoy would admit what no lease covers).
// No window admits more than the limit, Envoy and the plain checks
// together.
func TestRLQSSilentThenBack(t *testing.T) {
	t.Parallel()
	const limit, window = rlqsLimit, time.Minute
	tc := rlqsCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(tc.nodes[0].conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &simEnvoy{stream: stream, demand: 500, id: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}}
	plain := &simEnvoy{} // the plain checks' hits, for the ledger
	const step = 10 * time.Millisecond
	const key = "quota|tenant=acme"
	for i := 0; i < 15000; i++ { // 150 s; silent from 10 s to 80 s
		now := tc.clk.Now()
		silent := i >= 1000 && i < 8000
		if i == 7600 {
			// Nearly all the room goes to a plain caller: the 100 hits
			// left are far less than a 500-a-second assignment needs
			// (30,500), or than it admits in its first second (1,000).
			peek := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, window, 0)}}
			resp, err := tc.client(1).Check(ctx, peek)
			if err != nil {
				t.Fatal(err)
			}
			take := resp.Decisions[0].Remaining - 100
			resp, err = tc.client(1).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, window, take)}})
			if err != nil || !resp.Decisions[0].Allowed {
				t.Fatalf("take %d of the room = %v, %v", take, resp, err)
			}
			for range take {
				plain.admitted = append(plain.admitted, now)
			}
		}
		if i%100 == 0 && !silent {
			e.report(t, now, i == 0, time.Second)
			if i == 8000 {
				t.Logf("back after 70 s of silence: rate %d (strategy %v)", e.rate, e.strategy)
			}
		}
		if !silent {
			e.tick(now, step)
		}
		tc.clk.Advance(step)
	}
	most := mostInWindow([]*simEnvoy{e, plain}, window)
	t.Logf("Envoy admitted %d, plain checks %d; at most %d within one window (limit %d); rate at the end %d", len(e.admitted), len(plain.admitted), most, limit, e.rate)
	if most > limit {
		t.Fatalf("%d requests admitted within one window; want at most the limit %d", most, limit)
	}
}

// rlqsLimit is the rule of rlqsCluster's limits file: tenants of domain
// quota, 61,000 requests a minute (1,000 a second to divide under the Σ
// rule).
const rlqsLimit = 61000

// rlqsCluster starts three nodes (--replicas 2) with a limits file of
// rlqsLimit a minute per tenant of domain quota.
func rlqsCluster(t *testing.T) *testCluster {
	t.Helper()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	rule := fmt.Sprintf("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", rlqsLimit)
	if err := os.WriteFile(path, []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	return newTestClusterWith(t, 3, func(c *Config) { c.LimitsFile, c.Router.Replicas = path, 2 })
}

// mostInWindow returns the most requests the Envoys admitted within one
// window.
func mostInWindow(envoys []*simEnvoy, window time.Duration) int {
	var all []time.Time
	for _, e := range envoys {
		all = append(all, e.admitted...)
	}
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	most := 0
	for i, j := 0, 0; i < len(all); i++ {
		for !all[j].After(all[i].Add(-window)) {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// TestRLQSBadInputAndShutdown: a stream whose first report names no
// domain, or a bucket without an id, ends with INVALID_ARGUMENT; a node
// that stops sends its streams a zero TTL for each bucket, then ends them.
func TestRLQSBadInputAndShutdown(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, []byte("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, func(c *Config) { c.LimitsFile = path })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bucket := &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}
	for _, tc := range []struct {
		name string
		m    *rlqsv3.RateLimitQuotaUsageReports
	}{
		{"no domain", &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: bucket}}}},
		{"no bucket id", &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{}}}},
	} {
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(tc.m); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: Recv = %v; want InvalidArgument", tc.name, err)
		}
	}

	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &simEnvoy{stream: stream, id: bucket, demand: 5}
	e.report(t, ts.clk.Now(), true, time.Second)
	e.allowed = 5
	e.report(t, ts.clk.Now(), false, time.Second)
	if e.rate != 5 {
		t.Fatalf("assigned %d a second for a demand of 5; want 5", e.rate)
	}
	stopped := make(chan struct{})
	go func() { defer close(stopped); ts.srv.Shutdown(context.Background()) }()
	resp, err := stream.Recv()
	if err != nil || len(resp.BucketAction) != 1 || resp.BucketAction[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 0 {
		t.Fatalf("on shutdown the stream got %v, %v; want a zero TTL for its bucket", resp, err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("after the zero TTL, Recv = %v; want Unavailable (the node stops)", err)
	}
	<-stopped
}

// TestRLQSConcurrentStreams: streams of one node reporting on one bucket
// at once (for the race detector: they share the bucket's fair share).
func TestRLQSConcurrentStreams(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, []byte("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 6100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, func(c *Config) { c.LimitsFile = path })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := range 4 {
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id := &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}
		wg.Go(func() {
			for j := range 20 {
				m := &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
					BucketId: id, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: uint64(10 * (i + 1)),
				}}}
				if j == 0 {
					m.Domain = "quota"
				}
				if err := stream.Send(m); err != nil {
					t.Errorf("stream %d: send: %v", i, err)
					return
				}
				if resp, err := stream.Recv(); err != nil || len(resp.BucketAction) != 1 {
					t.Errorf("stream %d: receive: %v, %v; want one action", i, resp, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestRLQSOwnerCrash: two simulated Envoys on one bucket, one of them on
// the node that owns the bucket's key. That node is killed halfway: its
// Envoy keeps spending its assignment until the assignment's TTL (as
// Envoy does while it reconnects) and then reports to another node, which
// assigns anew. The leases behind the old assignments are part of the
// key's state, so the standby that takes the key over counts them: no
// window admits more than the limit across the crash, and the key's rate
// is assigned again after it (to whichever node asks first: fair share
// is per node).
func TestRLQSOwnerCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for failure detection")
	}
	const limit, window = rlqsLimit, time.Minute
	tc := rlqsCluster(t)
	owner, _ := tc.nodes[0].srv.Router().Owner("quota|tenant=acme")
	var victim, other, spare *testServer
	for _, ts := range tc.nodes {
		switch {
		case ts.cfg.NodeName == owner:
			victim = ts
		case other == nil:
			other = ts
		default:
			spare = ts
		}
	}
	if victim == nil {
		t.Fatalf("no node owns quota|tenant=acme (owner %q)", owner)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(ts *testServer) rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
		t.Helper()
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return stream
	}
	id := &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}
	onVictim := &simEnvoy{stream: open(victim), demand: 1500, id: id}
	onOther := &simEnvoy{stream: open(other), demand: 1500, id: id}
	envoys := []*simEnvoy{onVictim, onOther}
	const step = 10 * time.Millisecond
	first := map[*simEnvoy]bool{onVictim: true, onOther: true}
	var reconnectAt time.Time    // when the victim's Envoy reports to the spare node
	for i := 0; i < 15000; i++ { // 150 s
		now := tc.clk.Now()
		if i == 6000 { // 60 s: kill the owner; its Envoy reconnects once its assignment expired
			victim.crash()
			tc.waitMembers(2)
			// The fake clock stands still until the standby decides the
			// key (a peek through the spare node): failover takes real
			// time, which the loop below does not spend.
			peek := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("quota|tenant=acme", limit, window, 0)}}
			testkit.Eventually(t, 30*time.Second, func() bool {
				resp, err := sluicepb.NewRateLimitServiceClient(spare.conn).Check(ctx, peek)
				return err == nil && resp.Decisions[0].GetNode() != victim.cfg.NodeName
			}, "the key decided again after its owner's crash")
			reconnectAt = onVictim.expires
			onVictim.stream = nil
		}
		if onVictim.stream == nil && !now.Before(reconnectAt) {
			onVictim.stream, first[onVictim] = open(spare), true
		}
		if i%100 == 0 {
			for _, e := range envoys {
				if e.stream != nil {
					e.report(t, now, first[e], time.Second)
					first[e] = false
				}
			}
		}
		for _, e := range envoys {
			e.tick(now, step)
		}
		tc.clk.Advance(step)
	}
	most := mostInWindow(envoys, window)
	t.Logf("admitted %d and %d; at most %d within one window (limit %d); rates at the end %d and %d", len(onVictim.admitted), len(onOther.admitted), most, limit, onVictim.rate, onOther.rate)
	if most > limit {
		t.Fatalf("%d requests admitted within one window across the Envoys and the owner's crash; want at most the limit %d", most, limit)
	}
	if onVictim.rate+onOther.rate < 500 {
		t.Errorf("rates at the end %d and %d: want the key's rate (1,000 a second) mostly assigned again after the crash", onVictim.rate, onOther.rate)
	}
}

// TestRLQSRuleChange: a bucket already assigned a rate follows a change
// of its rule in the limits file. Its rule falls from 61,000 to 12,200 a
// minute (1,000 to 200 a second to divide): the bucket starts anew, is
// denied while the old assignment's lease still counts on the key, and
// then gets at most the new rate. No minute admits more than the old
// limit, and the minutes after the old lease ran out no more than the
// new one.
func TestRLQSRuleChange(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	rule := func(perMinute int) []byte {
		return []byte(fmt.Sprintf("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", perMinute))
	}
	if err := os.WriteFile(path, rule(61000), 0o644); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, func(c *Config) { c.LimitsFile, c.LimitsPollInterval = path, 20*time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &simEnvoy{stream: stream, demand: 600, id: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "acme"}}}
	const step = 10 * time.Millisecond
	run := func(from, to int) {
		for i := from; i < to; i++ {
			now := ts.clk.Now()
			if i%100 == 0 {
				e.report(t, now, i == 0, time.Second)
			}
			e.tick(now, step)
			ts.clk.Advance(step)
		}
	}
	run(0, 1000) // 10 s
	if e.rate != 600 {
		t.Fatalf("under the first rule: %d a second; want the demand, 600", e.rate)
	}
	reloads := counterValue(t, ts, "sluice_limits_reloads_total", "ok")
	if err := os.WriteFile(path, rule(12200), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		return counterValue(t, ts, "sluice_limits_reloads_total", "ok") > reloads
	}, "the limits file to be reloaded")
	changed := ts.clk.Now()
	run(1000, 20000) // to 200 s
	if e.rate == 0 || e.rate > 200 {
		t.Fatalf("after the rule fell to 200 a second: %d a second; want at most 200, and some", e.rate)
	}
	var after []time.Time
	for _, at := range e.admitted {
		if at.After(changed.Add(2 * time.Minute)) {
			after = append(after, at)
		}
	}
	most, later := mostInWindow([]*simEnvoy{e}, time.Minute), mostInWindow([]*simEnvoy{{admitted: after}}, time.Minute)
	t.Logf("admitted %d; at most %d within a minute, %d within a minute from two minutes after the change; rate at the end %d", len(e.admitted), most, later, e.rate)
	if most > 61000 || later > 12200 {
		t.Errorf("%d within a minute (limit 61,000), %d within a minute once the old lease ran out (limit 12,200)", most, later)
	}
}

// TestRLQSManyBucketsInOneReport: a report of 40 new buckets (one of them
// twice) on a node that owns none of their keys gets one action per
// usage, in the report's order, each a token bucket; the leases behind
// them are asked for at once, not one after the other.
func TestRLQSManyBucketsInOneReport(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(path, []byte("domain: quota\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 6100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := newTestClusterWith(t, 3, func(c *Config) { c.LimitsFile = path })
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(tc.nodes[0].conn).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for i := range 41 {
		tenant := fmt.Sprintf("t%02d", min(i, 39)) // the last one repeats t39
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": tenant}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 10,
		})
	}
	start := time.Now()
	if err := stream.Send(m); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("41 usages answered in %v", time.Since(start))
	if len(resp.BucketAction) != 41 {
		t.Fatalf("%d actions for 41 usages", len(resp.BucketAction))
	}
	for i, a := range resp.BucketAction {
		want := fmt.Sprintf("t%02d", min(i, 39))
		if got := a.GetBucketId().GetBucket()["tenant"]; got != want || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			t.Errorf("action %d: bucket %q, %v; want a token bucket for %s", i, got, a, want)
		}
	}
	stream.CloseSend()
}
