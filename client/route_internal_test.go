package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// hangingServer answers no Check: it tells entered, then waits for the
// call to end.
type hangingServer struct {
	sluicepb.UnimplementedRateLimitServiceServer
	entered chan struct{}
}

func (h *hangingServer) Check(ctx context.Context, _ *sluicepb.CheckRequest) (*sluicepb.CheckResponse, error) {
	h.entered <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestNeverSent: a routing client sends a member's checks through another
// node only when gRPC could not even connect to the member, so that a
// check the member may have decided is never decided twice. A refused
// connection is "never sent"; a connection cut while the node holds the
// call is not.
func TestNeverSent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := lis.Addr().String()
	lis.Close() // nothing listens there now
	cc, err := grpc.NewClient(refused, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = sluicepb.NewRateLimitServiceClient(cc).Check(ctx, &sluicepb.CheckRequest{})
	if !neverSent(err) {
		t.Errorf("Check to %s, where nothing listens: %v; want neverSent", refused, err)
	}

	lis, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hangingServer{entered: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	sluicepb.RegisterRateLimitServiceServer(srv, h)
	go srv.Serve(lis)
	defer srv.Stop()
	cc2, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	go func() {
		select {
		case <-h.entered:
			srv.Stop() // the node holds the call: cut it
		case <-ctx.Done():
		}
	}()
	_, err = sluicepb.NewRateLimitServiceClient(cc2).Check(ctx, &sluicepb.CheckRequest{})
	if err == nil || neverSent(err) {
		t.Errorf("Check cut while the node held it: %v; want an error that is not neverSent", err)
	}
}

// TestMovingRetriesOnlyWhatWasNotRecorded: the client sends a call again
// after "ownership moving" only when nothing of it was recorded. A batch
// over several owners can move after some of its checks were decided
// (the node says recorded: maybe); sent again, their hits would count
// twice (seen in TestRoutingExactWhileMembersChange: 19 allowed of a
// limit of 20, after one such retry).
func TestMovingRetriesOnlyWhatWasNotRecorded(t *testing.T) {
	withInfo := func(reason string, meta map[string]string) error {
		st, err := status.New(codes.Unavailable, "cluster: ownership moving: x").WithDetails(
			&errdetails.ErrorInfo{Domain: errorDomain, Reason: reason, Metadata: meta})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"moving, nothing recorded", withInfo(reasonMoving, map[string]string{metaRecorded: "no"}), true},
		{"moving, no word on records", withInfo(reasonMoving, nil), true},
		{"moving after some checks were decided", withInfo(reasonMoving, map[string]string{metaRecorded: recordedMaybe}), false},
		{"another reason", withInfo("NO_QUORUM", nil), false},
		{"an older node's message", status.Error(codes.Unavailable, "cluster: ownership moving: x"), true},
		{"another code", status.Error(codes.InvalidArgument, "cluster: ownership moving: x"), false},
	} {
		if got := moving(tc.err); got != tc.want {
			t.Errorf("%s: moving = %v; want %v", tc.name, got, tc.want)
		}
	}
}
