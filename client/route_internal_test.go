package client

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
