package node_test

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/cmd/sluice/node"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// BenchmarkHotKeyCluster: one Envoy key asked through all three nodes of a
// cluster in this process, from 48 goroutines, its limit never reached:
// forwarded to its owner by the two others, or (lease) decided by them
// from quota lease slices.
//
//	go test -run '^$' -bench HotKeyCluster -benchtime 3s -count 6 ./cmd/sluice/node
func BenchmarkHotKeyCluster(b *testing.B) {
	for _, mode := range []string{"forward", "lease"} {
		b.Run(mode, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "limits.yaml")
			lease := "false"
			if mode == "lease" {
				lease = "true"
			}
			if err := os.WriteFile(path, []byte("domain: hot\ndescriptors:\n  - key: tenant\n    lease: "+lease+"\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"), 0o644); err != nil {
				b.Fatal(err)
			}
			tc := nodetest.StartCluster(b, 3, func(c *node.Config) { c.LimitsFile = path })
			var clients []rlsv3.RateLimitServiceClient
			for _, n := range tc.Nodes {
				conn, err := grpc.NewClient(n.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { conn.Close() })
				clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
			}
			req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}},
			}}}
			var next atomic.Uint64
			b.SetParallelism(24)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rls := clients[next.Add(1)%uint64(len(clients))]
				for pb.Next() {
					resp, err := rls.ShouldRateLimit(context.Background(), req)
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Errorf("ShouldRateLimit = %v, %v", resp, err)
						return
					}
				}
			})
		})
	}
}
