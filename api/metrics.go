package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node's Prometheus metrics, on the node's own registry.
// They also receive the engine's measurements (actor.Observer).
type metrics struct {
	decisions     *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	keys          prometheus.Gauge
	evictions     prometheus.Counter
	expired       prometheus.Counter
	queueDepth    prometheus.Histogram
	batchChecks   prometheus.Histogram
	commitLatency prometheus.Histogram
	commitRecords prometheus.Histogram
	limitsReloads *prometheus.CounterVec
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
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_keys_in_memory",
			Help: "Keys whose state is held in memory.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_evictions_total",
			Help: "Keys that left memory for the memory bound (their state stays on disk).",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_expired_keys_total",
			Help: "Keys that left memory because their state emptied.",
		}),
		queueDepth: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_actor_mailbox_depth",
			Help:    "Calls waiting in an actor's mailbox when it finished a batch.",
			Buckets: []float64{0, 1, 4, 16, 64, 256, 1024},
		}),
		batchChecks: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_actor_batch_checks",
			Help:    "Checks an actor decided in one batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_storage_commit_duration_seconds",
			Help:    "Time to commit one storage transaction.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}),
		commitRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_storage_commit_records",
			Help:    "Key records written by one storage transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		limitsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_limits_reloads_total",
			Help: "Reloads of the limits file, by result (ok, error).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.decisions, m.latency, m.keys, m.evictions, m.expired, m.queueDepth,
		m.batchChecks, m.commitLatency, m.commitRecords, m.limitsReloads)
	return m
}

// Batch implements actor.Observer.
func (m *metrics) Batch(_, checks, queued int) {
	m.batchChecks.Observe(float64(checks))
	m.queueDepth.Observe(float64(queued))
}

// Keys implements actor.Observer.
func (m *metrics) Keys(delta int) { m.keys.Add(float64(delta)) }

// Evicted implements actor.Observer.
func (m *metrics) Evicted(n int) { m.evictions.Add(float64(n)) }

// Expired implements actor.Observer.
func (m *metrics) Expired(n int) { m.expired.Add(float64(n)) }

// commit is the store's OnCommit hook.
func (m *metrics) commit(records int, d time.Duration) {
	m.commitLatency.Observe(d.Seconds())
	m.commitRecords.Observe(float64(records))
}
