package api

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the decision metrics of the APIs, on the node's registry.
// The node's other metrics (engine, storage, cluster) are the node's (see
// cmd/sluice/node).
type metrics struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec

	// The children of decisions and latency that the decision APIs use,
	// looked up once rather than on every call.
	native, envoy apiMetrics
}

// apiMetrics are the decision metrics of one API.
type apiMetrics struct {
	latency                                prometheus.Observer
	allowed, denied, shadowDenied, errored prometheus.Counter
}

func newAPIMetrics(m *metrics, api string) apiMetrics {
	return apiMetrics{
		latency:      m.latency.WithLabelValues(api),
		allowed:      m.decisions.WithLabelValues(api, "allowed"),
		denied:       m.decisions.WithLabelValues(api, "denied"),
		shadowDenied: m.decisions.WithLabelValues(api, "shadow_denied"),
		errored:      m.decisions.WithLabelValues(api, "error"),
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Decisions made, by API (native, envoy) and result (allowed, denied, shadow_denied, error).",
		}, []string{"api", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_request_duration_seconds",
			Help:    "Time to answer a decision request, by API.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16), // 25µs .. 0.8s
		}, []string{"api"}),
	}
	reg.MustRegister(m.decisions, m.latency)
	m.native, m.envoy = newAPIMetrics(m, "native"), newAPIMetrics(m, "envoy")
	return m
}
