package api

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// The fuzz targets run the request path end to end below gRPC: decode the
// bytes as the request (what does not decode is INVALID_ARGUMENT before
// this, see TestUndecodableRequest), validate, decide on a real engine.
// Whatever the bytes, the answer is a decision or a status the caller can
// act on, never a panic or INTERNAL. CI runs each for a bounded time
// (.ci/run); inputs that failed once stay in testdata/fuzz.

// fuzzCodes are the statuses a request may get for its own content.
var fuzzCodes = map[codes.Code]bool{
	codes.OK: true, codes.InvalidArgument: true, codes.ResourceExhausted: true,
}

func FuzzNativeCheck(f *testing.F) {
	for _, req := range []*sluicepb.CheckRequest{
		{Checks: []*sluicepb.Check{{Key: []byte("user:1"), Limit: 10, Window: durationpb.New(time.Minute)}}},
		{Checks: []*sluicepb.Check{{Key: []byte("a"), Limit: 1, Window: durationpb.New(time.Second), Cost: proto.Int64(5), Penalty: true}}, AllOrNothing: true},
		{Checks: []*sluicepb.Check{{Key: []byte("b"), Limit: 3, Window: durationpb.New(time.Hour), Refund: true, Algorithm: sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET}}},
		{Checks: []*sluicepb.Check{{Key: []byte("c"), Limit: 3, Window: durationpb.New(time.Hour), Cost: proto.Int64(9), Usage: true}}},
		{Checks: []*sluicepb.Check{{Key: []byte("d"), Limit: 3, Window: durationpb.New(time.Hour), Cost: proto.Int64(2), ReserveFor: durationpb.New(time.Minute)}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ts := newTestServer(f, func(c *testConfig) { c.Durability = "memory" })
	n := &nativeService{s: ts.srv}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req sluicepb.CheckRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		_, err := n.Check(context.Background(), &req)
		if c := status.Code(err); !fuzzCodes[c] {
			t.Fatalf("Check(%v) = %v; want a decision or a status about the request", &req, err)
		}
	})
}

// FuzzSettle checks that Settle answers any request with results or a
// status about the request, never a panic or an internal error: handles
// are parsed, and their contents validated, before anything is sent.
func FuzzSettle(f *testing.F) {
	ts := newTestServer(f, func(c *testConfig) { c.Durability = "memory" })
	n := &nativeService{s: ts.srv}
	resp, err := n.Check(context.Background(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{
		Key: []byte("k"), Limit: 10, Window: durationpb.New(time.Minute), Cost: proto.Int64(4), ReserveFor: durationpb.New(time.Minute),
	}}})
	if err != nil {
		f.Fatal(err)
	}
	for _, req := range []*sluicepb.SettleRequest{
		{Settlements: []*sluicepb.Settlement{{Reservation: resp.Decisions[0].Reservation, Cost: 2}}},
		{Settlements: []*sluicepb.Settlement{{Reservation: []byte{1, 2, 3}, Cost: -1}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req sluicepb.SettleRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		_, err := n.Settle(context.Background(), &req)
		if c := status.Code(err); !fuzzCodes[c] {
			t.Fatalf("Settle(%v) = %v; want results or a status about the request", &req, err)
		}
	})
}

func FuzzEnvoyShouldRateLimit(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}},
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND},
		}}, HitsAddend: 2},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}, IsNegativeHits: true,
		}}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ts := newTestServer(f, func(c *testConfig) { c.Durability = "memory" })
	e := &envoyService{s: ts.srv}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		_, err := e.ShouldRateLimit(context.Background(), &req)
		if c := status.Code(err); !fuzzCodes[c] {
			t.Fatalf("ShouldRateLimit(%v) = %v; want a decision or a status about the request", &req, err)
		}
	})
}
