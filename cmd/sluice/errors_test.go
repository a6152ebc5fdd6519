package main

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// stubNode is a gRPC server on 127.0.0.1:0 whose native Check answers with
// check, for the answers a real node gives only in a broken cluster.
type stubNode struct {
	sluicepb.UnimplementedRateLimitServiceServer
	addr  string
	calls atomic.Int32
	check func(call int32) (*sluicepb.CheckResponse, error)
}

func startStub(t *testing.T, check func(call int32) (*sluicepb.CheckResponse, error)) *stubNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stubNode{addr: lis.Addr().String(), check: check}
	srv := grpc.NewServer()
	sluicepb.RegisterRateLimitServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s
}

func (s *stubNode) Check(context.Context, *sluicepb.CheckRequest) (*sluicepb.CheckResponse, error) {
	return s.check(s.calls.Add(1))
}

// allowedOnce is the answer of a stub that allows one check.
var allowedOnce = &sluicepb.CheckResponse{Decisions: []*sluicepb.Decision{{
	Allowed: true, Limit: 1, ResetAfter: durationpb.New(time.Second), RetryAfter: durationpb.New(0), Node: "stub",
}}}

// TestUnreachableOwnerNamed: when the node asked is up but cannot reach
// the key's owner, the CLI says so and names the owner, instead of
// claiming it cannot reach the node it asked.
func TestUnreachableOwnerNamed(t *testing.T) {
	t.Parallel()
	stub := startStub(t, func(int32) (*sluicepb.CheckResponse, error) {
		return nil, cluster.Status(&cluster.UnreachableError{Member: "node-2", Reason: "dial 127.0.0.1:9101: connect: connection refused"})
	})
	r := mustRun(t, exitError, nil, "check", "k", "--limit", "1", "--window", "1s", "--addr", stub.addr)
	if strings.Contains(r.stderr, "max retries") || strings.Contains(r.stderr, "cannot reach "+stub.addr) || !strings.Contains(r.stderr, stub.addr+" is up") || !strings.Contains(r.stderr, "could not reach node-2") {
		t.Errorf("check through a node that cannot reach the key's owner node-2: stderr %q; want %s up, node-2 named as unreachable", r.stderr, stub.addr)
	}
}

// TestRetryWhileOwnershipMoves: a check refused because the key's
// ownership is moving is retried, and its answer printed; a refund, which a
// retry could apply twice, is not.
func TestRetryWhileOwnershipMoves(t *testing.T) {
	t.Parallel()
	movingOnce := func(call int32) (*sluicepb.CheckResponse, error) {
		if call == 1 {
			return nil, cluster.Status(cluster.ErrMoving)
		}
		return allowedOnce, nil
	}
	stub := startStub(t, movingOnce)
	r := mustRun(t, exitOK, nil, "check", "k", "--limit", "1", "--window", "1s", "--addr", stub.addr)
	if got := stub.calls.Load(); got != 2 || !strings.Contains(r.stdout, "allowed") {
		t.Errorf("check refused once with ownership moving: %d calls, %v; want 2 calls, allowed", got, r)
	}

	stub = startStub(t, movingOnce)
	r = mustRun(t, exitError, nil, "check", "k", "--limit", "1", "--window", "1s", "--refund", "--addr", stub.addr)
	if got := stub.calls.Load(); got != 1 || !strings.Contains(r.stderr, "ownership moving") {
		t.Errorf("refund refused with ownership moving: %d calls, %v; want 1 call (no retry), the reason", got, r)
	}
}

// TestClientMistakes: the mistakes a new operator makes get a message that
// says what is wrong and what to do, each on one line.
func TestClientMistakes(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	for _, tc := range []struct {
		name string
		args []string
		want []string // in stderr
	}{
		{"limit without window", []string{"check", "k", "--limit", "3", "--addr", n.grpcAddr}, []string{"--window is required with --limit", "gives key k a window"}},
		{"window without limit", []string{"check", "k", "--window", "1m", "--addr", n.grpcAddr}, []string{"--limit is required with --window"}},
		{"zero window", []string{"check", "k", "--limit", "3", "--window", "0s", "--addr", n.grpcAddr}, []string{"--window 0s: want a positive duration"}},
		{"neither", []string{"check", "k", "--addr", n.grpcAddr}, []string{"--limit and --window are required", "override"}},
		{"no port", []string{"check", "k", "--limit", "3", "--window", "1m", "--addr", "127.0.0.1"}, []string{"--addr 127.0.0.1 has no port", "8081"}},
		{"HTTP port", []string{"check", "k", "--limit", "3", "--window", "1m", "--addr", n.httpAddr}, []string{n.httpAddr + " answered HTTP/1.1, not gRPC", "--http-addr", "--grpc-addr"}},
		{"TLS to plaintext", []string{"check", "k", "--limit", "3", "--window", "1m", "--addr", n.grpcAddr, "--insecure"}, []string{n.grpcAddr + " serves gRPC without TLS"}},
		{"nothing listening", []string{"check", "k", "--limit", "3", "--window", "1m", "--addr", "127.0.0.1:1"}, []string{"cannot reach 127.0.0.1:1", "is sluice serve running there", "SLUICE_ADDR"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, exitError, nil, tc.args...)
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) || strings.Count(r.stderr, "\n") != 1 {
					t.Errorf("sluice %s: stderr %q; want one line containing %q", strings.Join(tc.args, " "), r.stderr, w)
				}
			}
		})
	}
}
