package api

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// topList prints a top list as "key=count±error@owner ...".
func topList(t *sluicepb.TopKeys) string {
	s := ""
	for _, k := range t.GetKeys() {
		s += fmt.Sprintf("%s=%d±%d@%s ", PrintableKey(k.Key), k.Count, k.Error, k.Owner)
	}
	return s
}

// TestTrafficSingleNode: native and Envoy decisions show in GetTraffic:
// the keys decided and denied most (shadow denials apart), per-second
// counts, errors and latency.
func TestTrafficSingleNode(t *testing.T) {
	ts, _ := newLimitsServer(t, edgeLimits, nil)
	native := sluicepb.NewRateLimitServiceClient(ts.conn)
	for range 10 {
		if _, err := native.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check("hot", 6, time.Minute, 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := native.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check("cold", 6, time.Minute, 1), apitest.Check("hot", 6, time.Minute, 0)}}); err != nil {
		t.Fatal(err)
	}
	// A request that fails: 2 errors, nothing decided.
	if _, err := native.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check("x", -1, time.Minute, 1), apitest.Check("y", 1, time.Minute, 1)}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Check(limit -1) = %v; want InvalidArgument", err)
	}
	ec := newEnvoyClient(ts)
	for range 3 {
		ec.call("edge", 0, rd("service", "auth", "tier", "free"))                                       // shadow: 1 allowed, then shadow denials
		ec.call("edge", 0, inline(rd("remote_address", "10.0.0.9"), 1, typev3.RateLimitUnit_SECOND, 0)) // 1 allowed, 2 denied
		ec.call("edge", 0, rd("unknown", "x"))                                                          // no limit: not counted
	}
	ts.clk.Advance(1500 * time.Millisecond)

	resp, err := sluicepb.NewTrafficServiceClient(ts.conn).GetTraffic(ts.ctx(), &sluicepb.GetTrafficRequest{Top: 3, Seconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Node != "test-node" || len(resp.Nodes) != 1 || resp.Nodes[0].Name != "test-node" || resp.Nodes[0].Error != "" {
		t.Fatalf("GetTraffic() = node %q, nodes %v; want test-node's own figures", resp.Node, resp.Nodes)
	}
	wantTop := `hot=11±0@test-node edge|remote_address=10.0.0.9=3±0@test-node edge|service=auth|tier=free=3±0@test-node `
	if got := topList(resp.TopDecisions); got != wantTop {
		t.Errorf("top decisions = %s; want %s", got, wantTop)
	}
	wantDenied := `hot=4±0@test-node edge|remote_address=10.0.0.9=2±0@test-node `
	if got := topList(resp.TopDenials); got != wantDenied {
		t.Errorf("top denials = %s; want %s (no shadow denials)", got, wantDenied)
	}
	if got := resp.TopDecisions; got.Total != 18 || got.Floor != 1 || got.Window.AsDuration() != 51500*time.Millisecond {
		t.Errorf("top decisions: total %d, floor %d, window %v; want 18 (cold left out), floor 1, 51.5s", got.Total, got.Floor, got.Window.AsDuration())
	}
	n := resp.Nodes[0]
	if len(n.Seconds) != 5 {
		t.Fatalf("seconds = %v; want 5", n.Seconds)
	}
	first := n.Seconds[3] // the clock's first second; the last is 1.5 s later
	if first.Unix != epoch.Unix() || first.Decisions != 18 || first.Denials != 6 || first.Errors != 2 || first.Requests != 21 {
		t.Errorf("seconds[3] = %v; want %d: 18 decisions, 6 denials, 2 errors, 21 requests", first, epoch.Unix())
	}
	if n.Latency.Requests != 21 || n.Latency.Max.AsDuration() <= 0 || n.Started.AsTime() != epoch || n.ReadAt.AsTime() != epoch.Add(1500*time.Millisecond) {
		t.Errorf("latency %v, started %v, read at %v; want 21 requests, started at the epoch, read 1.5 s later", n.Latency, n.Started.AsTime(), n.ReadAt.AsTime())
	}
	if n.TopDecisions != nil {
		t.Errorf("nodes[0].top_decisions = %v; want it left out of the merged answer", n.TopDecisions)
	}
}

// TestTrafficAdminToken: GetTraffic names keys, so it needs the admin
// token when one is set; bad arguments are refused.
func TestTrafficAdminToken(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.AdminToken = "s3cret" })
	client := sluicepb.NewTrafficServiceClient(ts.conn)
	if _, err := client.GetTraffic(ts.ctx(), &sluicepb.GetTrafficRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetTraffic() without the token = %v; want Unauthenticated", err)
	}
	ctx := metadata.AppendToOutgoingContext(ts.ctx(), "authorization", "Bearer s3cret")
	if _, err := client.GetTraffic(ctx, &sluicepb.GetTrafficRequest{}); err != nil {
		t.Errorf("GetTraffic() with the token = %v; want no error", err)
	}
	if _, err := client.GetTraffic(ctx, &sluicepb.GetTrafficRequest{Top: -1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("GetTraffic(top -1) = %v; want InvalidArgument", err)
	}
}

// BenchmarkNativeCheck is the decision path of the native API for one
// check, with and without counting it for the operator's view, on one hot
// key and on skewed keys (Zipf over 100,000): in-process (validation,
// engine, response; no transport), and through gRPC on 127.0.0.1 (client
// included). Compare them with benchstat; cpu-ns/op, the CPU time of the
// whole process (actors, and the client for gRPC) per call, is steadier
// than ns/op on a machine other work shares.
func BenchmarkNativeCheck(b *testing.B) {
	for _, via := range []string{"inproc", "grpc"} {
		for _, keys := range []string{"hot", "zipf"} {
			for _, on := range []bool{false, true} {
				b.Run(fmt.Sprintf("via=%s/keys=%s/traffic=%v", via, keys, on), func(b *testing.B) {
					ts := newTestServer(b, func(c *testConfig) { c.Durability = "memory" })
					if !on {
						ts.srv.traffic = nil
					}
					check := (&nativeService{s: ts.srv}).Check
					if via == "grpc" {
						client := sluicepb.NewRateLimitServiceClient(ts.conn)
						check = func(ctx context.Context, req *sluicepb.CheckRequest) (*sluicepb.CheckResponse, error) {
							return client.Check(ctx, req)
						}
					}
					reqs := make([]*sluicepb.CheckRequest, 1<<12)
					z := rand.NewZipf(rand.New(rand.NewPCG(1, 1)), 1.1, 1, 100_000)
					for i := range reqs {
						key := "hot"
						if keys == "zipf" {
							key = fmt.Sprintf("tenant:%d", z.Uint64())
						}
						reqs[i] = &sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check(key, 1<<40, time.Minute, 1)}}
					}
					ctx := context.Background()
					b.ReportAllocs()
					b.ResetTimer()
					cpu := cpuTime()
					defer func() { b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op") }()
					b.RunParallel(func(pb *testing.PB) {
						i := 0
						for pb.Next() {
							if _, err := check(ctx, reqs[i&(len(reqs)-1)]); err != nil {
								b.Error(err)
								return
							}
							i++
						}
					})
				})
			}
		}
	}
}
