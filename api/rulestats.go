package api

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/api/limits"
)

// Per-rule statistics.
//
// envoyproxy/ratelimit counts, for each rule, the hits it saw (total_hits),
// those allowed (within_limit), those allowed above the near-limit ratio of
// the limit (near_limit), those denied (over_limit), and those denied that
// shadow mode let through (shadow_mode). Sluice counts the same, in hits
// (a descriptor's cost), labelled by domain and by the rule's statistics
// key (limits.Rule.StatKey: "message_type_marketing.to_number"), in
//
//	sluice_rule_hits_total{domain,key}
//	sluice_rule_within_limit_hits_total{domain,key}
//	sluice_rule_near_limit_hits_total{domain,key}
//	sluice_rule_over_limit_hits_total{domain,key}
//	sluice_rule_shadow_mode_hits_total{domain,key}
//
// An inline limit (or an override's, without a rule) is counted under the
// descriptor's own entries ("route_r.method_GET"), as ratelimit does.
//
// Cardinality. The keys of the limits file's rules are as many as its
// rules. Keys that hold request values (a rule with detailed_metric or
// value_to_metric, an inline limit, an override) are as many as clients
// care to send: at most RuleMetricsMaxKeys of them get series of their own
// (first come, for the life of the node); the others are counted under
// key "other", in their rule's domain or, without a rule, in domain
// "other", and each descriptor so counted increments
// sluice_rule_metrics_folded_total.

// DefaultRuleMetricsMaxKeys is Config.RuleMetricsMaxKeys when 0.
const DefaultRuleMetricsMaxKeys = 1000

// DefaultNearLimitRatio is Config.NearLimitRatio when 0: ratelimit's
// NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// otherLabel is the label value of the series that folded keys share.
const otherLabel = "other"

// ruleStats holds the per-rule counters. Its methods are safe for
// concurrent use; the read path takes a read lock only. It is the
// Prometheus collector of the five statistics: a descriptor adds to plain
// atomic counters, the five of a series side by side, and a scrape reads
// them (a prometheus.CounterVec's counters are one object each, so that
// counting a descriptor touched two or three cold objects).
type ruleStats struct {
	descs   [numRuleStats]*prometheus.Desc
	folded  prometheus.Counter
	maxKeys int
	ratio   float64

	mu     sync.RWMutex
	series map[string]map[string]*ruleCounters // domain, key
	// fromRequest counts the series admitted for keys that hold request
	// values; at maxKeys, more fold.
	fromRequest int
}

// The statistics, in the order of ruleCounters.n.
const (
	statHits = iota
	statWithin
	statNear
	statOver
	statShadow
	numRuleStats
)

// ruleCounters are the counters of one (domain, key), in hits: a
// descriptor's cost is a whole number.
type ruleCounters struct {
	n [numRuleStats]atomic.Uint64
}

func newRuleStats(reg prometheus.Registerer, maxKeys int, ratio float64) *ruleStats {
	if maxKeys == 0 {
		maxKeys = DefaultRuleMetricsMaxKeys
	}
	if ratio == 0 {
		ratio = DefaultNearLimitRatio
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"domain", "key"}, nil)
	}
	rs := &ruleStats{
		descs: [numRuleStats]*prometheus.Desc{
			statHits:   desc("sluice_rule_hits_total", "Hits (descriptor costs) of Envoy requests, by domain and rule key (envoyproxy/ratelimit's total_hits)."),
			statWithin: desc("sluice_rule_within_limit_hits_total", "Hits allowed, by domain and rule key (within_limit)."),
			statNear:   desc("sluice_rule_near_limit_hits_total", "Hits allowed above the near-limit ratio of the limit, by domain and rule key (near_limit)."),
			statOver:   desc("sluice_rule_over_limit_hits_total", "Hits denied, shadow mode's included, by domain and rule key (over_limit)."),
			statShadow: desc("sluice_rule_shadow_mode_hits_total", "Hits denied that shadow mode answered OK, by domain and rule key (shadow_mode)."),
		},
		folded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_rule_metrics_folded_total",
			Help: "Descriptors counted under key \"other\" because their rule key holds request values and the node already has the most such keys (--rule-metrics-max-keys).",
		}),
		maxKeys: maxKeys,
		ratio:   ratio,
		series:  make(map[string]map[string]*ruleCounters),
	}
	reg.MustRegister(rs, rs.folded)
	return rs
}

// Describe implements prometheus.Collector.
func (rs *ruleStats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range rs.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: each statistic of each series,
// read under the read lock and sent after it.
func (rs *ruleStats) Collect(ch chan<- prometheus.Metric) {
	type seriesValues struct {
		domain, key string
		n           [numRuleStats]uint64
	}
	rs.mu.RLock()
	n := 0
	for _, byKey := range rs.series {
		n += len(byKey)
	}
	all := make([]seriesValues, 0, n)
	for domain, byKey := range rs.series {
		for key, c := range byKey {
			sv := seriesValues{domain: domain, key: key}
			for i := range sv.n {
				sv.n[i] = c.n[i].Load()
			}
			all = append(all, sv)
		}
	}
	rs.mu.RUnlock()
	for _, sv := range all {
		for i, v := range sv.n {
			ch <- prometheus.MustNewConstMetric(rs.descs[i], prometheus.CounterValue, float64(v), sv.domain, sv.key)
		}
	}
}

// counters returns the counters of (domain, key); fromRequest says key
// holds request values, ruled that domain is a limits file's. Counters that
// exist, including the folded ones once maxKeys is reached, are found under
// the read lock without allocating: key is only copied to be added.
func (rs *ruleStats) counters(domain string, key []byte, fromRequest, ruled bool) *ruleCounters {
	folds := false
	rs.mu.RLock()
	c := rs.series[domain][string(key)]
	if c == nil && fromRequest && rs.fromRequest >= rs.maxKeys {
		c, folds = rs.series[foldDomain(domain, ruled)][otherLabel], true
	}
	rs.mu.RUnlock()
	if c != nil {
		if folds {
			rs.folded.Inc()
		}
		return c
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if c = rs.series[domain][string(key)]; c != nil {
		return c
	}
	if fromRequest {
		if rs.fromRequest >= rs.maxKeys {
			rs.folded.Inc()
			return rs.add(foldDomain(domain, ruled), otherLabel)
		}
		rs.fromRequest++
	}
	return rs.add(domain, string(key))
}

// foldDomain is the domain of the series that a folded key of domain is
// counted in: its own for a limits file's rule, "other" without a rule.
func foldDomain(domain string, ruled bool) string {
	if ruled {
		return domain
	}
	return otherLabel
}

// add returns the counters of (domain, key), creating them. rs.mu is held.
func (rs *ruleStats) add(domain, key string) *ruleCounters {
	byKey := rs.series[domain]
	if byKey == nil {
		byKey = make(map[string]*ruleCounters)
		rs.series[domain] = byKey
	}
	if c := byKey[key]; c != nil {
		return c
	}
	c := new(ruleCounters)
	byKey[key] = c
	return c
}

// count counts the outcome o of descriptor d, of a request of domain.
// Refunds are not hits and are not counted.
func (rs *ruleStats) count(domain string, o *envoyOutcome) {
	d := o.d
	if d.refund {
		return
	}
	var buf [128]byte // the statistics key, built here to be looked up
	var c *ruleCounters
	if r := d.rule; r != nil {
		c = rs.counters(r.Domain, r.AppendRequestStatKey(buf[:0], d.entries), r.StatKeyFromRequest(), true)
	} else {
		c = rs.counters(domain, appendDescriptorStatKey(buf[:0], d.entries), true, false)
	}
	cost := d.cost
	c.n[statHits].Add(cost)
	if !o.allowed {
		c.n[statOver].Add(cost)
		if d.shadow {
			c.n[statShadow].Add(cost)
		}
		return
	}
	c.n[statWithin].Add(cost)
	// Near the limit: the part of the cost that lands above the ratio,
	// counting the hits used after the decision (whole numbers).
	threshold := math.Floor(float64(d.limit) * rs.ratio)
	after := float64(d.limit - max(o.remaining, 0))
	if near := min(after-threshold, float64(cost)); near > 0 {
		c.n[statNear].Add(uint64(near))
	}
}

// appendDescriptorStatKey appends the statistics key of a descriptor
// without a rule to b: its entries as key_value (key alone for an empty
// value) joined by dots.
func appendDescriptorStatKey(b []byte, entries []limits.Entry) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, '.')
		}
		b = append(b, e.Key...)
		if e.Value != "" {
			b = append(b, '_')
			b = append(b, e.Value...)
		}
	}
	return b
}
