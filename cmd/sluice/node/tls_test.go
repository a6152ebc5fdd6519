package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestClusterPeersOverTLS: with TLS and client certificates required,
// nodes forward to each other over TLS with their own certificate.
func TestClusterPeersOverTLS(t *testing.T) {
	t.Parallel()
	cert, key := apitest.Cert(t, t.TempDir(), "node")
	tc := newTestClusterWith(t, 2, func(c *Config) { c.TLSCert, c.TLSKey, c.TLSClientCA = cert, key, cert })
	owners := map[string]int{}
	for k := 0; k < 20; k++ {
		resp, err := tc.client(0).Check(tc.nodes[0].ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("tls-%d", k), 5, time.Minute, 1)}})
		if err != nil || !resp.Decisions[0].Allowed {
			t.Fatalf("check tls-%d = %v, %v; want allowed", k, resp, err)
		}
		owners[resp.Decisions[0].Node]++
	}
	if owners["node-1"] == 0 {
		t.Fatalf("no check was forwarded to node-1: %v", owners)
	}
}
