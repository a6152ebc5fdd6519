package node

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// healthServices are the names grpc health answers for: the server as a
// whole ("") and each service a client or a probe may name
// (grpc-health-probe -service sluice.v1.RateLimitService, Envoy's health
// checks of its rate limit cluster). They all follow the node's readiness
// (see NotReady), and Shutdown turns them all NOT_SERVING. The peer
// service is not among them: peers learn about each other by gossip.
var healthServices = []string{
	"",
	sluicepb.RateLimitService_ServiceDesc.ServiceName,
	rlsv3.RateLimitService_ServiceDesc.ServiceName,
	sluicepb.AdminService_ServiceDesc.ServiceName,
}

// setHealth sets the status of every service of healthServices.
func (n *Node) setHealth(s healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range healthServices {
		n.health.SetServingStatus(name, s)
	}
}
