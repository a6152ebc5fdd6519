package apitest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Check is a native check of cost hits on key against limit per window
// (cost 0 peeks).
func Check(key string, limit int64, window time.Duration, cost int64) *sluicepb.Check {
	return &sluicepb.Check{Key: []byte(key), Limit: limit, Window: durationpb.New(window), Cost: proto.Int64(cost)}
}

// ListMembers calls ListMembers through admin, failing t on an error.
func ListMembers(t testing.TB, ctx context.Context, admin sluicepb.AdminServiceClient) *sluicepb.ListMembersResponse {
	t.Helper()
	resp, err := admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		t.Fatalf("ListMembers() = %v; want no error", err)
	}
	return resp
}
