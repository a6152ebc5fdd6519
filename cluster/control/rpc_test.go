package control

import (
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// fakeLeader is a leader's peer service: a frozen one never answers a
// proposal (its process stopped, its kernel still holding the
// connection); a live one starts epoch 7.
type fakeLeader struct {
	sluicepb.UnimplementedPeerServiceServer
	frozen bool
	thaw   chan struct{} // closed at the end of the test
}

func (f *fakeLeader) Propose(ctx context.Context, req *sluicepb.ProposeRequest) (*sluicepb.ProposeResponse, error) {
	if f.frozen {
		select {
		case <-f.thaw:
			return nil, status.Error(codes.Unavailable, "thawed")
		case <-ctx.Done():
			// As a real server's handler: the caller's deadline (whichever
			// side notices it first, the caller sees DEADLINE_EXCEEDED).
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	b, _ := json.Marshal(Result{Epoch: 7, Version: 42})
	return &sluicepb.ProposeResponse{Result: b}, nil
}

// serveLeader serves f on 127.0.0.1 and returns its address.
func serveLeader(t *testing.T, f *fakeLeader) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sluicepb.RegisterPeerServiceServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestProposeToAFrozenLeader: a proposal sent to a leader that never
// answers returns within its deadline, and, once Raft names another
// leader, at once; the next attempt reaches the new leader and starts the
// epoch. Before, a proposal had no deadline and the connection was only
// replaced by the next call, which a node without an epoch never made: it
// stayed without one for as long as the frozen leader's connection held.
func TestProposeToAFrozenLeader(t *testing.T) {
	thaw := make(chan struct{})
	defer close(thaw) // before the servers stop (cleanups run after)
	frozen := serveLeader(t, &fakeLeader{frozen: true, thaw: thaw})
	live := serveLeader(t, &fakeLeader{})
	lc := &leaderConn{dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}
	defer lc.close()
	start := command{Op: opStart, Name: "n2", ID: "id-2"}
	propose := func(addr, id string, timeout time.Duration) (Result, error) {
		conn, err := lc.get(addr, id)
		if err != nil {
			return Result{}, err
		}
		return leaderClient{sluicepb.NewPeerServiceClient(conn), "cluster-1", timeout}.propose(context.Background(), "n2", start)
	}

	// The leader never answers: the proposal gives up at its deadline.
	const timeout = 300 * time.Millisecond
	began := time.Now()
	_, err := propose(frozen, "id-1", timeout)
	if took := time.Since(began); err == nil || took > timeout+time.Second {
		t.Fatalf("propose to a frozen leader with a deadline of %v: returned after %v with %v; want an error within the deadline", timeout, took.Round(time.Millisecond), err)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("propose to a frozen leader: %v; want DEADLINE_EXCEEDED", err)
	}

	// The leader changes while a proposal waits on the frozen one: the
	// proposal ends at once, long before its deadline.
	done := make(chan error, 1)
	began = time.Now()
	go func() {
		_, err := propose(frozen, "id-1", time.Minute)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // not a poll: the proposal is on its way
	lc.follow(live, "id-3")
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("propose to a frozen leader that lost its place: no error")
		}
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("propose to a frozen leader that lost its place returned after %v; want at once", took.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("propose to a frozen leader still waits 10 s after Raft named another leader")
	}

	// Tried again: the new leader starts the epoch.
	res, err := propose(live, "id-3", timeout)
	if err != nil || res.Epoch != 7 {
		t.Fatalf("propose to the new leader = %+v, %v; want epoch 7", res, err)
	}
}
