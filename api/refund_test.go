package api

import (
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestRefundNeedsACredential: with an admin or refund token set, a refund
// (native refund, Envoy is_negative_hits) without one of them is refused
// with Unauthenticated and gives nothing back: the full key stays full.
// With either token it gives the hits back. With no token set, refunds
// stay open like every decision.
func TestRefundNeedsACredential(t *testing.T) {
	for _, tc := range []struct {
		name          string
		admin, refund string
		send          string // the bearer token the refund carries
		want          codes.Code
	}{
		{name: "admin token set, none sent", admin: "adm1n", want: codes.Unauthenticated},
		{name: "admin token set, a wrong one sent", admin: "adm1n", send: "guess", want: codes.Unauthenticated},
		{name: "admin token set and sent", admin: "adm1n", send: "adm1n", want: codes.OK},
		{name: "refund token set, none sent", refund: "r3fund", want: codes.Unauthenticated},
		{name: "refund token set and sent", admin: "adm1n", refund: "r3fund", send: "r3fund", want: codes.OK},
		{name: "no token set", want: codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestServer(t, func(c *testConfig) { c.AdminToken, c.RefundToken = tc.admin, tc.refund })
			rl := sluicepb.NewRateLimitServiceClient(ts.conn)
			ctx := ts.ctx()
			if tc.send != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.send)
			}
			check := func(cost int64, refund bool) *sluicepb.Check {
				return &sluicepb.Check{Key: []byte("victim"), Limit: 5, Window: durationpb.New(time.Minute), Cost: proto.Int64(cost), Refund: refund}
			}
			ts.hit(check(5, false)) // full
			_, err := rl.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{check(1000, true)}})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("native refund: %v; want code %v", err, tc.want)
			}
			wantRemaining := int64(0)
			if tc.want == codes.OK {
				wantRemaining = 5
			}
			if d := ts.hit(check(0, false)); d.Remaining != wantRemaining {
				t.Errorf("after the native refund: remaining %d; want %d", d.Remaining, wantRemaining)
			}

			// The same over Envoy's API, on a key of its own.
			lim := inline(rd("k", "v"), 5, typev3.RateLimitUnit_MINUTE, 0)
			ec := newEnvoyClient(ts)
			ec.call("edge", 5, lim)
			neg := proto.Clone(lim).(*ratelimitv3.RateLimitDescriptor)
			neg.HitsAddend, neg.IsNegativeHits = nil, true
			_, err = rlsv3.NewRateLimitServiceClient(ts.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1000, Descriptors: []*ratelimitv3.RateLimitDescriptor{neg}})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Envoy is_negative_hits: %v; want code %v", err, tc.want)
			}
			// One more hit: allowed (4 left) only if the refund gave 5 back.
			resp := ec.call("edge", 0, lim)
			wantCode, wantLeft := rlsv3.RateLimitResponse_OVER_LIMIT, uint32(0)
			if tc.want == codes.OK {
				wantCode, wantLeft = rlsv3.RateLimitResponse_OK, 4
			}
			if st := resp.Statuses[0]; st.Code != wantCode || st.LimitRemaining != wantLeft {
				t.Errorf("a hit after the Envoy refund: %v, remaining %d; want %v, %d", st.Code, st.LimitRemaining, wantCode, wantLeft)
			}
		})
	}
}

// TestLeaseNeedsACredential: with a refund or admin token set, a lease
// (native check with lease) or an RLQS stream without one of them is
// refused with Unauthenticated and grants nothing: the key keeps all its
// room. With the refund token the slice is granted.
func TestLeaseNeedsACredential(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.AdminToken, c.RefundToken = "adm1n", "r3fund" })
	rl := sluicepb.NewRateLimitServiceClient(ts.conn)
	lease := &sluicepb.Check{Key: []byte("hot"), Limit: 100, Window: durationpb.New(time.Minute), Cost: proto.Int64(40),
		ReserveFor: durationpb.New(time.Second), Lease: true}
	for _, send := range []string{"", "guess"} {
		ctx := ts.ctx()
		if send != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+send)
		}
		if _, err := rl.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{lease}}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("a lease with token %q: %v; want Unauthenticated", send, err)
		}
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(ts.conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("an RLQS stream with token %q: %v; want Unauthenticated", send, err)
		}
	}
	peek := &sluicepb.Check{Key: []byte("hot"), Limit: 100, Window: durationpb.New(time.Minute), Cost: proto.Int64(0)}
	if d := ts.hit(peek); d.Remaining != 100 {
		t.Fatalf("after the refused leases: remaining %d; want 100 (nothing granted)", d.Remaining)
	}
	ctx := metadata.AppendToOutgoingContext(ts.ctx(), "authorization", "Bearer r3fund")
	resp, err := rl.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{lease}})
	if err != nil || !resp.Decisions[0].Allowed {
		t.Fatalf("a lease with the refund token: %v, %v; want a granted slice", resp, err)
	}
	if d := ts.hit(peek); d.Remaining != 60 {
		t.Errorf("with a slice of 40 open: remaining %d; want 60", d.Remaining)
	}
}
