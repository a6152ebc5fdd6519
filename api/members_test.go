package api

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// listMembers returns ts's ListMembers, failing the test on error.
func (ts *testServer) listMembers() *sluicepb.ListMembersResponse {
	ts.t.Helper()
	return apitest.ListMembers(ts.t, ts.ctx(), ts.admin())
}

// TestListMembersSingleNode: a node outside a cluster lists itself, alive,
// at its gRPC address, owning every key.
func TestListMembersSingleNode(t *testing.T) {
	ts := newTestServer(t, nil)
	got := ts.listMembers()
	want := &sluicepb.ClusterMember{Name: "test-node", GrpcAddr: ts.addr, State: "alive", Share: 1}
	if len(got.Members) != 1 || !equalMember(got.Members[0], want) || got.Node != "test-node" || got.MapVersion != 0 {
		t.Errorf("ListMembers() on a single node = %v; want node test-node, epoch 0, members [%v]", got, want)
	}
}

// TestListMembersAdminToken: ListMembers is an admin call: with an admin
// token set, it needs the token.
func TestListMembersAdminToken(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.AdminToken = "s3cret" })
	_, err := ts.admin().ListMembers(ts.ctx(), &sluicepb.ListMembersRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListMembers() without the token = %v; want Unauthenticated", err)
	}
	ctx := metadata.AppendToOutgoingContext(ts.ctx(), "authorization", "Bearer s3cret")
	resp, err := ts.admin().ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil || len(resp.Members) != 1 {
		t.Errorf("ListMembers() with the token = %v, %v; want the node itself", resp, err)
	}
}

func equalMember(a, b *sluicepb.ClusterMember) bool {
	return a.Name == b.Name && a.GossipAddr == b.GossipAddr && a.GrpcAddr == b.GrpcAddr &&
		a.State == b.State && a.Share == b.Share
}
