package edge

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
)

// metrics are the edge's Prometheus metrics, on a registry of its own.
type metrics struct {
	requests    *prometheus.CounterVec
	decisions   *prometheus.CounterVec
	failures    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	reloads     *prometheus.CounterVec
	originError prometheus.Counter
	unlimited   prometheus.Counter
	badPath     prometheus.Counter
	// usage counts the costs responses reported (rules with a
	// response_cost), usageHits their sum.
	usage, usageHits *prometheus.CounterVec
}

// decisionResults and decisionSources are the labels of
// sluice_edge_decisions_total.
var (
	decisionResults = [...]string{"allowed", "denied", "shadow_denied", "shadow_allowed"}
	decisionSources = [...]string{"", "owner", "forwarded", "sluice", "cache", "failure", "lease"}
)

func newMetrics(reg prometheus.Registerer, c *client.Client) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_edge_requests_total",
			Help: "Requests by route and result: allowed (proxied to the origin), denied (429), unlimited (no route or no rule applied; proxied), bad_path (400: a path that origins read in different ways, such as an encoded slash).",
		}, []string{"route", "result"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_edge_decisions_total",
			Help: "Decisions of each rule: result allowed, denied, shadow_denied or shadow_allowed (shadow rules); source owner, forwarded or sluice (Sluice decided), cache (the local denial cache denied without a call), failure (Sluice did not decide: the failure policy did), lease (from a quota lease slice the edge holds, without a call), empty (a rule not asked: a leased rule denied first).",
		}, []string{"route", "rule", "result", "source"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_edge_failures_total",
			Help: "Rule decisions Sluice did not make, by failure (unreachable, timeout, unavailable, overloaded, rejected, canceled, closed) and the policy that decided (open: allowed, closed: denied).",
		}, []string{"route", "rule", "failure", "policy"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_edge_decision_duration_seconds",
			Help:    "Time the edge took to decide a request it limits (the latency it adds before proxying), by route.",
			Buckets: []float64{50e-6, 100e-6, 200e-6, 350e-6, 500e-6, 750e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 1},
		}, []string{"route"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_edge_rules_reloads_total",
			Help: "Reloads of the rules file: ok (in force), error (refused: the previous rules stay in force).",
		}, []string{"result"}),
		originError: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_edge_origin_errors_total",
			Help: "Requests the origin could not answer (the edge answered 502).",
		}),
	}
	m.usage = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_edge_usage_reports_total",
		Help: "Costs read from responses (rules with a response_cost), by route, rule and result: recorded (within the limit), over_limit (recorded; the budget is now over it), none (the response carried no cost), error (unreadable, or Sluice did not record it).",
	}, []string{"route", "rule", "result"})
	m.usageHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_edge_usage_reported_hits_total",
		Help: "Hits (tokens) responses reported and Sluice recorded, by route and rule.",
	}, []string{"route", "rule"})
	m.unlimited = m.requests.WithLabelValues("", "unlimited")
	m.badPath = m.requests.WithLabelValues("", "bad_path")
	reg.MustRegister(m.requests, m.decisions, m.failures, m.latency, m.reloads, m.originError, m.usage, m.usageHits)
	stat := func(name, help string, f func(client.Stats) uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 {
			return float64(f(c.Stats()))
		}))
	}
	stat("sluice_edge_sluice_calls_total", "gRPC calls to Sluice (retries included).", func(s client.Stats) uint64 { return s.Calls })
	stat("sluice_edge_sluice_checks_total", "Checks those calls carried (the ratio to calls is the batch size).", func(s client.Stats) uint64 { return s.Batched })
	stat("sluice_edge_sluice_retries_total", "Calls sent again after \"ownership moving\".", func(s client.Stats) uint64 { return s.Retries })
	stat("sluice_edge_cache_denials_total", "Checks the local denial cache denied without calling Sluice.", func(s client.Stats) uint64 { return s.CacheDenials })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_edge_cache_keys",
		Help: "Keys in the local denial cache.",
	}, func() float64 { return float64(c.Stats().CacheKeys) }))
	return m
}

// routeMetrics are the metrics of one route, resolved once.
type routeMetrics struct {
	m         *metrics
	name      string
	allowed   prometheus.Counter
	denied    prometheus.Counter
	latency   prometheus.Observer
	unlimited prometheus.Counter
	rules     map[string]*ruleMetrics
}

// ruleMetrics caches the decision counters of one rule.
type ruleMetrics struct {
	c [len(decisionResults)][len(decisionSources)]atomic.Pointer[prometheus.Counter]
}

func (m *metrics) route(name string, rules []httplimit.Rule) *routeMetrics {
	rm := &routeMetrics{
		m:         m,
		name:      name,
		allowed:   m.requests.WithLabelValues(name, "allowed"),
		denied:    m.requests.WithLabelValues(name, "denied"),
		latency:   m.latency.WithLabelValues(name),
		unlimited: m.requests.WithLabelValues(name, "unlimited"),
		rules:     map[string]*ruleMetrics{},
	}
	for i := range rules {
		rm.rules[rules[i].Name] = &ruleMetrics{}
	}
	return rm
}

// observe counts a decision of the route's limiter.
func (rm *routeMetrics) observe(_ *http.Request, res *httplimit.Result) {
	if len(res.Rules) == 0 {
		rm.unlimited.Inc()
		return
	}
	rm.latency.Observe(res.Took.Seconds())
	if res.Allowed {
		rm.allowed.Inc()
	} else {
		rm.denied.Inc()
	}
	for i := range res.Rules {
		rr := &res.Rules[i]
		d := &rr.Decision
		result := 0
		switch {
		case rr.Rule.Shadow && d.Allowed:
			result = 3
		case rr.Rule.Shadow:
			result = 2
		case !d.Allowed:
			result = 1
		}
		rm.counter(rr.Rule.Name, result, int(d.Source)).Inc()
		if d.Source == client.SourceFailure {
			rm.m.failures.WithLabelValues(rm.name, rr.Rule.Name, d.Failure.String(), d.Policy.String()).Inc()
		}
	}
}

// observeUsage counts a cost a response of the route reported.
func (rm *routeMetrics) observeUsage(rep *httplimit.UsageReport) {
	result := "recorded"
	switch {
	case rep.Err != nil || rep.Cost > 0 && rep.Decision.Source == client.SourceFailure:
		result = "error"
	case rep.Cost == 0:
		result = "none"
	case !rep.Decision.Allowed:
		result = "over_limit"
	}
	rm.m.usage.WithLabelValues(rm.name, rep.Rule.Name, result).Inc()
	if result == "recorded" || result == "over_limit" {
		rm.m.usageHits.WithLabelValues(rm.name, rep.Rule.Name).Add(float64(rep.Cost))
	}
}

func (rm *routeMetrics) counter(rule string, result, source int) prometheus.Counter {
	if source < 0 || source >= len(decisionSources) {
		source = 0
	}
	r := rm.rules[rule]
	p := &r.c[result][source]
	if c := p.Load(); c != nil {
		return *c
	}
	c := rm.m.decisions.WithLabelValues(rm.name, rule, decisionResults[result], decisionSources[source])
	p.Store(&c)
	return c
}
