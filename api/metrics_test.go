package api

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestCanceledNotError: a call its client cancels before the answer (a
// load generator stopping, a proxy whose client went away) counts as
// result="canceled", not as an error an alert would fire on; a call that
// fails on the node still counts as an error. The cancel arrives while
// the call is in the node: an interceptor holds the call until the client
// has gone, then lets the services decide it, on the real engine.
func TestCanceledNotError(t *testing.T) {
	held := make(chan struct{}, 1)
	ts := newTestServer(t, func(c *testConfig) {
		c.Intercept = func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("test-hold")) > 0 {
				held <- struct{}{}
				<-ctx.Done()
			}
			return h(ctx, req)
		}
	})
	native := sluicepb.NewRateLimitServiceClient(ts.conn)
	envoy := rlsv3.NewRateLimitServiceClient(ts.conn)
	calls := map[string]func(context.Context) error{
		"native": func(ctx context.Context) error {
			_, err := native.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("cancel:k", 10, time.Minute, 1), nativeCheck("cancel:j", 10, time.Minute, 1)}})
			return err
		},
		"envoy": func(ctx context.Context) error {
			_, err := envoy.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "cancel", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				inline(rd("k", "v"), 10, typev3.RateLimitUnit_MINUTE, 1)}})
			return err
		},
	}
	for api, call := range calls {
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ts.ctx(), "test-hold", "1"))
		errc := make(chan error, 1)
		go func() { errc <- call(ctx) }()
		<-held
		cancel()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Errorf("%s call cancelled by its client: %v; want Canceled", api, err)
		}
	}
	// A node-side error: a bad request.
	if _, err := native.Check(ts.ctx(), &sluicepb.CheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Check(no checks) = %v; want InvalidArgument", err)
	}

	m := ts.srv.metrics
	// The services answer the cancelled call after the client has gone:
	// poll until they have counted it.
	testkit.Eventually(t, 10*time.Second, func() bool {
		return count(t, m.native.canceled) >= 2 && count(t, m.envoy.canceled) >= 1
	}, "the cancelled calls to be counted (native 2, envoy 1)")
	for _, tt := range []struct {
		api, result string
		c           float64
		want        float64
	}{
		{"native", "canceled", count(t, m.native.canceled), 2},
		{"native", "error", count(t, m.native.errored), 1},
		{"envoy", "canceled", count(t, m.envoy.canceled), 1},
		{"envoy", "error", count(t, m.envoy.errored), 0},
	} {
		if tt.c != tt.want {
			t.Errorf("sluice_decisions_total{api=%q,result=%q} = %v; want %v", tt.api, tt.result, tt.c, tt.want)
		}
	}
}

// count is a counter's value.
func count(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
