package node

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsHandler serves the node's registry: the Prometheus text format,
// or OpenMetrics to a scraper that asks for it (Accept:
// application/openmetrics-text). Errors of the handler itself are counted
// on the registry (promhttp_metric_handler_errors_total).
func (n *Node) metricsHandler() http.Handler {
	return promhttp.HandlerFor(n.registry, promhttp.HandlerOpts{
		Registry:          n.registry,
		EnableOpenMetrics: true,
	})
}
