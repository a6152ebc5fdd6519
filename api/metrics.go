package api

import (
	"context"
	"errors"

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

	// Usage reports and reservations (see usage.go).
	usage usageMetrics
}

// usageMetrics count usage reports and reservations.
type usageMetrics struct {
	// reports and reportedHits count usage reports (cost > 0) by API;
	// overLimit the reports that did not fit (the key went, or was, over
	// its limit).
	reports, reportedHits, overLimit *prometheus.CounterVec
	// reserves counts reserving checks by result (allowed, denied);
	// reservedHits the hits of the allowed ones.
	reserves     *prometheus.CounterVec
	reservedHits prometheus.Counter
	// settles counts settlements by result (settled, not_held);
	// returnedHits and overshootHits what the settled ones gave back and
	// recorded above their estimate.
	settles                     *prometheus.CounterVec
	returnedHits, overshootHits prometheus.Counter
}

// apiMetrics are the decision metrics of one API.
type apiMetrics struct {
	latency                                prometheus.Observer
	allowed, denied, shadowDenied, errored prometheus.Counter
	// canceled counts the checks of calls their client cancelled before
	// the answer (a client that gave up or ended): not the node's error.
	canceled prometheus.Counter
}

// failed counts the n checks of a call that returned err: canceled when
// the client cancelled it (ctx is the call's), errored otherwise.
func (m *apiMetrics) failed(ctx context.Context, err error, n int) {
	if canceled(ctx, err) {
		m.canceled.Add(float64(max(n, 1)))
		return
	}
	m.errored.Add(float64(max(n, 1)))
}

// canceled reports whether err, the error of a call whose context is ctx,
// is the client's cancelling it.
func canceled(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled)
}

func newAPIMetrics(m *metrics, api string) apiMetrics {
	return apiMetrics{
		latency:      m.latency.WithLabelValues(api),
		allowed:      m.decisions.WithLabelValues(api, "allowed"),
		denied:       m.decisions.WithLabelValues(api, "denied"),
		shadowDenied: m.decisions.WithLabelValues(api, "shadow_denied"),
		errored:      m.decisions.WithLabelValues(api, "error"),
		canceled:     m.decisions.WithLabelValues(api, "canceled"),
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Decisions made, by API (native, envoy) and result (allowed, denied, shadow_denied; error: the call failed; canceled: its client cancelled it first).",
		}, []string{"api", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_request_duration_seconds",
			Help:    "Time to answer a decision request, by API.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16), // 25µs .. 0.8s
		}, []string{"api"}),
	}
	reg.MustRegister(m.decisions, m.latency)
	u := &m.usage
	u.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_usage_reports_total",
		Help: "Usage reports (hits recorded whether or not they fit: Envoy usage descriptors, native checks with usage), by API.",
	}, []string{"api"})
	u.reportedHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_usage_reported_hits_total",
		Help: "Hits recorded by usage reports, by API.",
	}, []string{"api"})
	u.overLimit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_usage_reports_over_limit_total",
		Help: "Usage reports that did not fit: recorded with their key at or over its limit, by API.",
	}, []string{"api"})
	u.reserves = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_reservations_total",
		Help: "Reserving checks (native API, reserve_for), by result (allowed, denied).",
	}, []string{"result"})
	u.reservedHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_reserved_hits_total",
		Help: "Hits reserved by allowed reserving checks (their estimates).",
	})
	u.settles = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_settlements_total",
		Help: "Settlements, by result: settled, or not_held (settled already, expired, or the key was reset).",
	}, []string{"result"})
	u.returnedHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_settlement_returned_hits_total",
		Help: "Hits given back by settlements whose cost was below the estimate.",
	})
	u.overshootHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_settlement_overshoot_hits_total",
		Help: "Hits recorded by settlements above their estimate.",
	})
	reg.MustRegister(u.reports, u.reportedHits, u.overLimit, u.reserves, u.reservedHits, u.settles, u.returnedHits, u.overshootHits)
	m.native, m.envoy = newAPIMetrics(m, "native"), newAPIMetrics(m, "envoy")
	return m
}
