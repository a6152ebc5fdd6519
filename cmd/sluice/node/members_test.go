package node

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// listMembers returns ts's ListMembers, failing the test on error.
func (ts *testServer) listMembers() *sluicepb.ListMembersResponse {
	ts.t.Helper()
	return apitest.ListMembers(ts.t, ts.ctx(), ts.admin())
}

// TestListMembersCluster: every node of a 3-node cluster lists the three,
// alive, with their addresses, each owning about a third of the keys, all
// three voters and one leader they agree on; once one stops, it is listed
// as dead (its epoch ended, still a member) with no keys and the two others
// own about half each.
func TestListMembersCluster(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t, 3)
	for i, ts := range tc.nodes {
		got := ts.listMembers()
		if got.Node != ts.cfg.NodeName || got.MapVersion == 0 || got.ClusterId == "" || len(got.Members) != 3 {
			t.Fatalf("ListMembers() via node %d = %v; want node %s, a map version, a cluster ID, 3 members", i, got, ts.cfg.NodeName)
		}
		leaders := 0
		for _, m := range got.Members {
			if !m.Voter || !m.Live || m.Epoch == 0 {
				t.Errorf("ListMembers() via node %d: %v; want a live voter with an epoch", i, m)
			}
			if m.Leader {
				leaders++
				if m.Name != got.Leader {
					t.Errorf("ListMembers() via node %d: leader %s, but %s is marked leader", i, got.Leader, m.Name)
				}
			}
		}
		if leaders != 1 {
			t.Errorf("ListMembers() via node %d: %d leaders; want 1", i, leaders)
		}
		var sum float64
		for j, m := range got.Members {
			peer := tc.nodes[j] // names sort as the nodes were added
			if m.Name != peer.cfg.NodeName || m.State != "alive" || m.GrpcAddr != peer.srv.GRPCAddr() ||
				m.GossipAddr != peer.cfg.Cluster.GossipAddr {
				t.Errorf("ListMembers() via node %d: member %d = %v; want %s alive at gRPC %s, gossip %s",
					i, j, m, peer.cfg.NodeName, peer.srv.GRPCAddr(), peer.cfg.Cluster.GossipAddr)
			}
			if math.Abs(m.Share-1.0/3) > 0.03 {
				t.Errorf("ListMembers() via node %d: %s owns %.4f of the keys; want about 1/3", i, m.Name, m.Share)
			}
			sum += m.Share
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("ListMembers() via node %d: shares sum to %v; want 1", i, sum)
		}
	}

	tc.nodes[2].stop()
	tc.waitMembers(2)
	if err := testkit.Wait(10*time.Second, func() error {
		got := tc.nodes[0].listMembers()
		ok := len(got.Members) == 3 && got.Members[2].State == "dead" && !got.Members[2].Live && got.Members[2].Share == 0
		for _, m := range got.Members[:min(2, len(got.Members))] {
			ok = ok && m.State == "alive" && math.Abs(m.Share-0.5) < 0.03
		}
		if !ok {
			return fmt.Errorf("ListMembers() via node 0 after node-2 stopped = %v; want node-2 dead with share 0, the others alive with about 1/2", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
