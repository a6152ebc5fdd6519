package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/cluster/control"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// testToken is the admin token of the tests of separate listeners.
const testToken = "listeners-token"

// dialTest is a plain-text client connection to addr, closed at the end
// of the test.
func dialTest(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// serviceCodes calls one method of each gRPC service a node may serve on
// conn, with the admin token and the cluster's ID (as the peers send it),
// and returns each call's status code by service name.
func serviceCodes(t *testing.T, conn *grpc.ClientConn, clusterID string) map[string]codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken, control.ClusterHeader, clusterID)
	got := map[string]codes.Code{}
	_, err := sluicepb.NewRateLimitServiceClient(conn).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("listeners:probe", 1000, time.Minute, 0)}})
	got["native"] = status.Code(err)
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}},
		Limit:   &ratelimitpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typepb.RateLimitUnit_MINUTE},
	}}})
	got["envoy"] = status.Code(err)
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	got["health"] = status.Code(err)
	_, err = sluicepb.NewAdminServiceClient(conn).ListMembers(ctx, &sluicepb.ListMembersRequest{})
	got["admin"] = status.Code(err)
	_, err = sluicepb.NewPeerServiceClient(conn).Forward(ctx, &sluicepb.ForwardRequest{})
	got["peer"] = status.Code(err)
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err == nil {
		// Send fails with io.EOF once the node ended the stream; Recv
		// then says why.
		_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
		_, err = stream.Recv()
	}
	got["reflection"] = status.Code(err)
	return got
}

// TestSeparateListeners: with --peer-addr and --admin-addr, each service is
// served on its own listener only (UNIMPLEMENTED elsewhere), with the same
// credentials everywhere; the members dial one another's peer and admin
// addresses, so checks are forwarded and admin calls fanned out; and a
// member that serves everything on --grpc-addr (as every node did before)
// works alongside. Every key allows exactly its limit, whichever node is
// asked.
func TestSeparateListeners(t *testing.T) {
	t.Parallel()
	tc := newTestClusterWith(t, 3, func(c *Config) {
		c.AdminToken = testToken
		if c.NodeName != "node-2" {
			c.PeerAddr, c.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
		}
	})
	ts := tc.nodes[0]
	if a := []string{ts.srv.GRPCAddr(), ts.srv.PeerAddr(), ts.srv.AdminAddr()}; a[0] == a[1] || a[0] == a[2] || a[1] == a[2] {
		t.Fatalf("gRPC, peer and admin addresses %v; want three listeners", a)
	}
	for _, tt := range []struct {
		listener string
		addr     string
		served   []string // the others must answer UNIMPLEMENTED
	}{
		{"grpc-addr", ts.srv.GRPCAddr(), []string{"native", "envoy", "health"}},
		{"peer-addr", ts.srv.PeerAddr(), []string{"peer", "health"}},
		{"admin-addr", ts.srv.AdminAddr(), []string{"admin", "reflection", "health"}},
		{"node-2's grpc-addr", tc.nodes[2].srv.GRPCAddr(), []string{"native", "envoy", "health", "admin", "peer", "reflection"}},
	} {
		got := serviceCodes(t, dialTest(t, tt.addr), ts.srv.Router().Map().ClusterID)
		for svc, code := range got {
			switch served := slices.Contains(tt.served, svc); {
			case served && code != codes.OK:
				t.Errorf("%s (%s): %s call = %v; want OK", tt.listener, tt.addr, svc, code)
			case !served && code != codes.Unimplemented:
				t.Errorf("%s (%s): %s call = %v; want Unimplemented", tt.listener, tt.addr, svc, code)
			}
		}
	}

	// The same interceptors on every listener: peer and admin calls
	// without the token are refused.
	ctx := ts.ctx()
	if _, err := sluicepb.NewPeerServiceClient(dialTest(t, ts.srv.PeerAddr())).Forward(ctx, &sluicepb.ForwardRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Forward on peer-addr without the token = %v; want Unauthenticated", err)
	}
	if _, err := sluicepb.NewAdminServiceClient(dialTest(t, ts.srv.AdminAddr())).ListMembers(ctx, &sluicepb.ListMembersRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListMembers on admin-addr without the token = %v; want Unauthenticated", err)
	}

	// Forwarding: every node's checks reach every key's owner.
	const keys, limit = 30, 4
	allowed := make(map[string]int)
	deciders := map[string]int{}
	for round := 0; round < limit+2; round++ {
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("listeners:%d", k)
			via := (round + k) % 3
			var resp *sluicepb.CheckResponse
			var err error
			// A lease that lapsed on a loaded machine: refused, nothing
			// recorded; a client tries again. The last answer is judged
			// below.
			_ = testkit.Wait(10*time.Second, func() error {
				resp, err = tc.client(via).Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, limit, time.Minute, 1)}})
				if status.Code(err) == codes.Unavailable {
					return err
				}
				return nil
			})
			if err != nil {
				t.Fatalf("Check(%q) via node-%d: %v", key, via, err)
			}
			if resp.Decisions[0].Allowed {
				allowed[key]++
			}
			deciders[resp.Decisions[0].Node]++
		}
	}
	for k := 0; k < keys; k++ {
		if key := fmt.Sprintf("listeners:%d", k); allowed[key] != limit {
			t.Errorf("%q: %d of %d hits allowed; want %d", key, allowed[key], limit+2, limit)
		}
	}
	if len(deciders) != 3 {
		t.Errorf("decisions came from %v; want all three nodes", deciders)
	}

	// Admin fan-out: each node answers for the keys of the others through
	// their admin addresses.
	for i := range tc.nodes {
		actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("listeners:%d", k)
			resp, err := tc.nodes[i].admin().GetKey(actx, &sluicepb.GetKeyRequest{Key: []byte(key)})
			if err != nil || resp.State.GetUsed() != limit {
				t.Fatalf("GetKey(%q) via node-%d = %v, %v; want %d used", key, i, resp, err, limit)
			}
		}
		list, err := tc.nodes[i].admin().ListKeys(actx, &sluicepb.ListKeysRequest{Prefix: []byte("listeners:"), PageSize: 100})
		if err != nil || len(list.Keys) != keys {
			t.Fatalf("ListKeys via node-%d = %d keys, %v; want %d", i, len(list.GetKeys()), err, keys)
		}
	}
}

// TestSeparateListenersConfig: --peer-addr needs a cluster, and two
// listeners cannot share an address.
func TestSeparateListenersConfig(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"peer without cluster", func(c *Config) { c.PeerAddr = "127.0.0.1:0" }, "only a cluster node"},
		{"admin on grpc", func(c *Config) { c.GRPCAddr, c.AdminAddr = "127.0.0.1:8081", "127.0.0.1:8081" }, "--admin-addr and --grpc-addr"},
		{"admin on http", func(c *Config) { c.HTTPAddr, c.AdminAddr = "127.0.0.1:8080", "127.0.0.1:8080" }, "--admin-addr and --http-addr"},
		{"all on port 0", func(c *Config) { c.GRPCAddr, c.AdminAddr, c.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0" }, ""},
	} {
		c := DefaultConfig()
		tt.edit(&c)
		err := c.Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: Validate() = %v; want an error containing %q", tt.name, err, tt.want)
		}
	}
}
