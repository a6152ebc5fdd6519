package node

import (
	"runtime"
	"runtime/debug"
	"time"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/control"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the node's metrics other than the APIs' decisions (see
// api): the engine's, the store's and the cluster's, on the node's own
// registry, with the Go runtime's and the process's and the build info.
// They receive the measurements of actor.Observer, cluster.Observer and
// cluster.RouterObserver.
//
// Every labelled series whose label values are known is created at zero
// by newMetrics, so that a scrape shows it before its first event and
// increase() sees that event.
type metrics struct {
	keys          prometheus.Gauge
	evictions     prometheus.Counter
	expired       prometheus.Counter
	damaged       prometheus.Counter
	queueDepth    prometheus.Histogram
	batchChecks   prometheus.Histogram
	commitLatency prometheus.Histogram
	commitRecords prometheus.Histogram
	ckptLatency   prometheus.Histogram
	ckptRecords   prometheus.Histogram
	ckptFailures  prometheus.Counter
	limitsReloads *prometheus.CounterVec
	compactions   prometheus.Counter
	tlsReloads    *prometheus.CounterVec // registered with TLS only

	connections     *prometheus.GaugeVec
	connectionWaits *prometheus.CounterVec

	peerDecisions     prometheus.Counter
	forwarded         *prometheus.CounterVec
	forwardLatency    prometheus.Histogram
	forwardBatch      prometheus.Histogram
	handoffKeys       *prometheus.CounterVec
	refused           *prometheus.CounterVec
	unserved          *prometheus.CounterVec
	renewals          *prometheus.CounterVec
	replicated        *prometheus.CounterVec
	membershipChanges *prometheus.CounterVec
	members           prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_keys_in_memory",
			Help: "Keys whose state is held in memory.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_evictions_total",
			Help: "Keys that left memory for the memory bound (their state stays on disk).",
		}),
		damaged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_damaged_records_total",
			Help: "Keys whose stored state was found damaged (it cannot be decoded), each counted once per process, the first time it is read; such a key answers DATA_LOSS until it is reset.",
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
		ckptLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_storage_checkpoint_duration_seconds",
			Help:    "Time to write one checkpoint (the keys committed to the write-ahead log since the last one) into the data file.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 16),
		}),
		ckptRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_storage_checkpoint_records",
			Help:    "Keys written into the data file by one checkpoint.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}),
		ckptFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_storage_checkpoint_failures_total",
			Help: "Checkpoints that failed (their keys stay in the write-ahead log and in memory, which grow until one succeeds).",
		}),
		limitsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_limits_reloads_total",
			Help: "Reloads of the limits file, by result (ok, error).",
		}, []string{"result"}),
	}
	m.connections = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_connections",
		Help: "Connections open, by listener (grpc, peer, admin, http, health); each listener holds at most --max-connections.",
	}, []string{"listener"})
	m.connectionWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_connection_limit_waits_total",
		Help: "Times a listener found --max-connections connections open and left new ones waiting until one closed, by listener.",
	}, []string{"listener"})
	reg.MustRegister(m.connections, m.connectionWaits)
	m.peerDecisions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_peer_decisions_total",
		Help: "Checks this node decided for other nodes that forwarded them.",
	})
	m.forwarded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_forwarded_checks_total",
		Help: "Checks forwarded to their owner, by result (ok, error).",
	}, []string{"result"})
	m.forwardLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_forward_duration_seconds",
		Help:    "Time of one Forward call to a peer.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	})
	m.forwardBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sluice_forward_batch_checks",
		Help:    "Checks carried by one Forward call.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8),
	})
	m.handoffKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_handoff_keys_total",
		Help: "Keys handed over when ownership moved, by direction (sent, received, failed).",
	}, []string{"direction"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_refused_checks_total",
		Help: "Checks this node answered UNAVAILABLE rather than decide without showing it may, by reason (no_quorum: no lease from the Raft leader; moving: the key's state has not arrived; owner_down: its owner is down and the policy keeps its keys for it; standby: the key's standby did not confirm the write).",
	}, []string{"reason"})
	m.unserved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_unserved_seconds_total",
		Help: "Seconds during which this node could not decide all the keys it acts for, by reason (no_quorum: no lease, so none of them; waiting: some gained keys waited for their state).",
	}, []string{"reason"})
	m.replicated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_replicated_records_total",
		Help: "Records sent to the keys' standbys, by result (ok: committed there; error: the decisions they carried were refused, their hits kept here).",
	}, []string{"result"})
	m.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_lease_renewals_total",
		Help: "Lease renewals with the Raft leader, by result (granted, or refused: no leader, no quorum of voters, the epoch ended).",
	}, []string{"result"})
	m.membershipChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_membership_changes_total",
		Help: "Membership changes seen, by kind (joined, updated, left, failed).",
	}, []string{"kind"})
	m.members = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_members",
		Help: "Live members in this node's view.",
	})
	reg.MustRegister(m.peerDecisions, m.forwarded, m.forwardLatency, m.forwardBatch, m.handoffKeys,
		m.refused, m.unserved, m.renewals, m.replicated, m.membershipChanges, m.members)
	m.compactions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_data_file_compactions_total",
		Help: "Compactions of the data file (a copy of its records into a new file that replaces it, once its free pages outnumber the used ones).",
	})
	reg.MustRegister(m.keys, m.evictions, m.expired, m.damaged, m.queueDepth,
		m.batchChecks, m.commitLatency, m.commitRecords, m.ckptLatency, m.ckptRecords, m.ckptFailures,
		m.limitsReloads, m.compactions)
	for _, c := range []struct {
		vec    *prometheus.CounterVec
		values []string
	}{
		{m.limitsReloads, []string{"ok", "error"}},
		{m.forwarded, []string{"ok", "error"}},
		{m.handoffKeys, []string{"sent", "received", "failed"}},
		{m.refused, []string{"no_quorum", "moving", "owner_down", "standby"}},
		{m.unserved, []string{"no_quorum", "waiting"}},
		{m.renewals, []string{"granted", "refused"}},
		{m.replicated, []string{"ok", "error"}},
		{m.membershipChanges, []string{cluster.ChangeJoined.String(), cluster.ChangeUpdated.String(),
			cluster.ChangeLeft.String(), cluster.ChangeFailed.String()}},
	} {
		for _, v := range c.values {
			c.vec.WithLabelValues(v)
		}
	}
	// A node is a member of its own view: alone, it counts itself. In a
	// cluster, every membership change sets the gauge (see Changed).
	m.members.Set(1)

	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerBuildInfo registers sluice_build_info, 1 with the build as its
// labels.
func registerBuildInfo(reg prometheus.Registerer, build BuildInfo) {
	build = build.withDefaults()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_build_info",
		Help: "Always 1; its labels say which build the node runs.",
		ConstLabels: prometheus.Labels{
			"version":    build.Version,
			"revision":   build.Revision,
			"go_version": runtime.Version(),
		},
	})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
}

// withDefaults fills b's empty fields from the Go build info: the main
// module's version and the VCS revision "go build" stamped.
func (b BuildInfo) withDefaults() BuildInfo {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && b.Revision == "" {
				b.Revision = s.Value
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
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

// Damaged counts a damaged record (actor.Observer).
func (m *metrics) Damaged() { m.damaged.Inc() }

// commit is the store's OnCommit hook.
func (m *metrics) commit(records int, d time.Duration) {
	m.commitLatency.Observe(d.Seconds())
	m.commitRecords.Observe(float64(records))
}

// checkpoint is the store's OnCheckpoint hook.
func (m *metrics) checkpoint(records int, d time.Duration, err error) {
	m.ckptLatency.Observe(d.Seconds())
	m.ckptRecords.Observe(float64(records))
	if err != nil {
		m.ckptFailures.Inc()
	}
}

func (m *metrics) compacted(_, _ int64, _ time.Duration) { m.compactions.Inc() }

// Changed implements cluster.Observer.
func (m *metrics) Changed(kind cluster.ChangeKind, _ uint64, members int) {
	m.membershipChanges.WithLabelValues(kind.String()).Inc()
	m.members.Set(float64(members))
}

// JoinAttempt implements cluster.Observer.
func (m *metrics) JoinAttempt(error) {}

// Forwarded implements cluster.RouterObserver.
func (m *metrics) Forwarded(_ string, checks int, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.forwarded.WithLabelValues(result).Add(float64(checks))
	m.forwardLatency.Observe(d.Seconds())
	m.forwardBatch.Observe(float64(checks))
}

// HandedOff implements cluster.RouterObserver.
func (m *metrics) HandedOff(_ string, keys int, err error) {
	if err != nil {
		m.handoffKeys.WithLabelValues("failed").Add(float64(keys))
		return
	}
	m.handoffKeys.WithLabelValues("sent").Add(float64(keys))
}

// HandoffReceived implements cluster.RouterObserver.
func (m *metrics) HandoffReceived(_ string, keys int) {
	m.handoffKeys.WithLabelValues("received").Add(float64(keys))
}

// Served implements cluster.RouterObserver.
func (m *metrics) Served(checks int) { m.peerDecisions.Add(float64(checks)) }

// Refused implements cluster.RouterObserver.
func (m *metrics) Refused(reason string, checks int) {
	m.refused.WithLabelValues(reason).Add(float64(checks))
}

// Renewed implements cluster.RouterObserver.
func (m *metrics) Renewed(granted bool) {
	if granted {
		m.renewals.WithLabelValues("granted").Inc()
	} else {
		m.renewals.WithLabelValues("refused").Inc()
	}
}

// Unserved implements cluster.RouterObserver.
func (m *metrics) Unserved(d time.Duration, noLease, waiting bool) {
	switch {
	case noLease:
		m.unserved.WithLabelValues("no_quorum").Add(d.Seconds())
	case waiting:
		m.unserved.WithLabelValues("waiting").Add(d.Seconds())
	}
}

// Replicated implements cluster.RouterObserver.
func (m *metrics) Replicated(_ string, records int, err error) {
	if err != nil {
		m.replicated.WithLabelValues("error").Add(float64(records))
		return
	}
	m.replicated.WithLabelValues("ok").Add(float64(records))
}

// registerTLS adds the metrics of a node serving TLS: reloads of its
// certificate files, ok and error from 0, and when the certificate in
// force expires.
func (m *metrics) registerTLS(reg *prometheus.Registry, c *certs) {
	m.tlsReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_tls_reloads_total",
		Help: "Reloads of the TLS certificate, key and client CA after they changed on disk, by result (ok: served from the next handshake; error: refused, the previous ones stay).",
	}, []string{"result"})
	m.tlsReloads.WithLabelValues("ok")
	m.tlsReloads.WithLabelValues("error")
	reg.MustRegister(m.tlsReloads, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_tls_certificate_expiry_timestamp_seconds",
		Help: "When the TLS certificate in force expires (Unix time): alert well before it, in case rotation stalls.",
	}, func() float64 { return float64(c.notAfter().Unix()) }))
}

// registerControl registers the gauges of the control plane c: whether
// this node leads, the map version it applied, its epoch, the voters and
// how long its lease still runs.
func (m *metrics) registerControl(reg *prometheus.Registry, c *control.Control) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("sluice_raft_leader", "1 while this node is the Raft leader of the control plane, else 0.", func() float64 {
			if c.Leader() != "" && c.Leader() == c.Self() {
				return 1
			}
			return 0
		}),
		gauge("sluice_raft_voters", "Voters of the Raft group, as this node's configuration lists them (0 before it joined).", func() float64 {
			n := 0
			for _, v := range c.Servers() {
				if v {
					n++
				}
			}
			return float64(n)
		}),
		gauge("sluice_cluster_map_version", "Version of the cluster map this node applied (the Raft index of its last change): every node reaches the same versions in the same order.", func() float64 {
			return float64(c.Map().Version)
		}),
		gauge("sluice_cluster_epoch", "This node's epoch (a new one at each start, or after the leader ended the last one); 0 while it has none.", func() float64 {
			return float64(c.Epoch())
		}),
		gauge("sluice_lease_remaining_seconds", "How long this node's lease still runs; 0 or less: it holds none and decides nothing.", func() float64 {
			return c.LeaseRemaining().Seconds()
		}),
		gauge("sluice_partitions_led", "Partitions this node leads in the map it applied (--partitions; 0 without).", func() float64 {
			return float64(partitionCount(c, func(p *control.Partition) bool { return p.Leader == c.ID() }))
		}),
		gauge("sluice_partitions_under_replicated", "Partitions this node leads whose in-sync set is smaller than their replica list: a replica is down or catching up, and one more failure may make them wait.", func() float64 {
			return float64(partitionCount(c, func(p *control.Partition) bool { return p.Leader == c.ID() && len(p.ISR) < len(p.Replicas) }))
		}),
		gauge("sluice_partitions_offline", "Partitions of the cluster with no leader, as this node's map says (the same on every node): their keys are refused until their last in-sync replica is back, or an operator forgets it.", func() float64 {
			return float64(partitionCount(c, func(p *control.Partition) bool { return p.Leader == "" }))
		}),
	)
}

// partitionCount counts the partitions of c's map for which f is true.
func partitionCount(c *control.Control, f func(*control.Partition) bool) int {
	m := c.Map()
	n := 0
	for i := range m.Partitions {
		if f(&m.Partitions[i]) {
			n++
		}
	}
	return n
}
