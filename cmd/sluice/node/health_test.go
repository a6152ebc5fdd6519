package node

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestHealthPerService: grpc health answers for the server as a whole
// ("") and for each service a probe may name (grpc-health-probe -service
// sluice.v1.RateLimitService), all SERVING while the node serves and
// NOT_SERVING once it shuts down; a service the node does not serve is
// NotFound.
func TestHealthPerService(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, nil)
	services := []string{
		"",
		"sluice.v1.RateLimitService",
		"envoy.service.ratelimit.v3.RateLimitService",
		"sluice.v1.AdminService",
	}
	// The names a probe types are those of the generated code.
	for i, desc := range []string{sluicepb.RateLimitService_ServiceDesc.ServiceName, rlsv3.RateLimitService_ServiceDesc.ServiceName, sluicepb.AdminService_ServiceDesc.ServiceName} {
		if desc != services[i+1] {
			t.Fatalf("service %q is named %q in its descriptor", services[i+1], desc)
		}
	}
	hc := healthpb.NewHealthClient(ts.conn)
	for _, service := range services {
		t.Run("serving/"+service, func(t *testing.T) {
			resp, err := hc.Check(ts.ctx(), &healthpb.HealthCheckRequest{Service: service})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health Check(%q) = %v, %v; want SERVING", service, resp, err)
			}
		})
	}
	if _, err := hc.Check(ts.ctx(), &healthpb.HealthCheckRequest{Service: "sluice.v1.PeerService"}); status.Code(err) != codes.NotFound {
		t.Errorf("health Check(sluice.v1.PeerService) = %v; want NotFound (not a service clients probe)", err)
	}

	srv := ts.srv
	if err := srv.Shutdown(ts.ctx()); err != nil {
		t.Fatal(err)
	}
	for _, service := range services {
		t.Run("shut down/"+service, func(t *testing.T) {
			// The listener is closed: ask the health server itself.
			resp, err := srv.health.Check(ts.ctx(), &healthpb.HealthCheckRequest{Service: service})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("health Check(%q) after Shutdown = %v, %v; want NOT_SERVING", service, resp, err)
			}
		})
	}
}
