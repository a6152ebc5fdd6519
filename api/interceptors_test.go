package api

import (
	"context"
	"testing"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestInterceptRecoversPanics: a handler that panics answers Internal,
// naming the method, and the node goes on serving.
func TestInterceptRecoversPanics(t *testing.T) {
	ts := newTestServer(t, nil)
	intercept := ts.srv.intercept(newRequestCodec())
	info := &grpc.UnaryServerInfo{FullMethod: "/sluice.v1.RateLimitService/Check"}
	resp, err := intercept(ts.ctx(), &sluicepb.CheckRequest{}, info, func(context.Context, any) (any, error) {
		panic("a bug")
	})
	if st := status.Convert(err); resp != nil || st.Code() != codes.Internal || st.Message() != "internal error in /sluice.v1.RateLimitService/Check" {
		t.Fatalf("a panicking handler answered %v, %v; want Internal naming the method", resp, err)
	}
	if _, err := ts.admin().ListMembers(ts.ctx(), &sluicepb.ListMembersRequest{}); err != nil {
		t.Errorf("ListMembers() after the panic: %v", err)
	}
}
