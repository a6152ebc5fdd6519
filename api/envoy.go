package api

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/api/limits"
)

// envoyService serves envoy.service.ratelimit.v3.RateLimitService, the rate
// limit service protocol of Envoy and of the gateways built on it. It
// follows envoyproxy/ratelimit, the reference implementation, except where
// docs/envoy.md says otherwise. In short:
//
//   - Each descriptor of a request is one check, counted under
//     envoyKey(domain, entries). All the checks of a request go to the
//     engine as one batch; each is decided on its own (not all or nothing).
//   - The limit is the descriptor's inline limit if it has one, else the
//     limits file's rule; an admin Override on the key wins over both. A
//     descriptor with no limit, or with an unlimited rule, is OK and
//     counts nothing.
//   - A request that can never fit (a limit of 0, or a cost above the
//     limit) is OVER_LIMIT, not an error: Envoy lets a request through when
//     its rate limit service fails. Errors (InvalidArgument) are for
//     malformed requests, and record nothing.
//   - Shadow-mode rules (every limit, with Config.ShadowMode) count and
//     report, but their descriptors say OK and never make the request
//     OVER_LIMIT.
//   - Usage descriptors (a rule with usage: true, or a domain of
//     Config.UsageDomains) report hits already spent, as Envoy's
//     apply_on_stream_done sends them: recorded even when they do not
//     fit (a cost above the limit included), so the key may go over its
//     limit; a cost-0 descriptor is OVER_LIMIT while the key is at or
//     above its limit (see actor.Check.Usage, docs/envoy.md).
type envoyService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

// ShouldRateLimit decides one request of Envoy's rate limit filter.
func (e *envoyService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s := e.s
	start := time.Now()
	var t trafficCall
	resp, err := s.shouldRateLimit(ctx, req, &t)
	s.metrics.envoy.latency.Observe(time.Since(start).Seconds())
	s.record(ctx, &t, start, len(req.GetDescriptors()), err)
	if err != nil {
		s.metrics.envoy.failed(ctx, err, len(req.GetDescriptors()))
		return nil, toStatus(err)
	}
	return resp, nil
}

// envoyKind is what a descriptor needs.
type envoyKind uint8

const (
	// envoyNoLimit: no limit applies. OK, no current_limit, nothing counted.
	envoyNoLimit envoyKind = iota
	// envoyUnlimited: an unlimited rule. OK, nothing counted.
	envoyUnlimited
	// envoyCheck: the engine decides.
	envoyCheck
	// envoyBlocked: a limit of 0. OVER_LIMIT without asking the engine.
	envoyBlocked
)

// envoyDescriptor is one descriptor of a request on its way through
// shouldRateLimit.
type envoyDescriptor struct {
	kind envoyKind
	// key is the engine key: envoyKey of the domain and the entries (or of
	// the shared descriptor, for a share_threshold rule).
	key string
	// limit, window and algo are what the engine is asked.
	limit  int64
	window time.Duration
	algo   actor.Algorithm
	// unit and mult describe the window in current_limit: window = unit ×
	// mult.
	unit limits.Unit
	mult uint32
	// name is the rule's name, "" for an inline limit or an unnamed rule.
	name string
	// shadow and quota are the rule's shadow_mode and quota_mode.
	shadow, quota bool
	// usage: the hits are usage already spent (the rule's usage, or
	// Config.UsageDomains), recorded even when they do not fit.
	usage bool
	// meta is the rule's metadata, for the response's dynamic metadata;
	// nil without a rule (or for an unlimited one).
	meta *structpb.Struct
	// rule is the limits file's rule, nil without one; entries are the
	// descriptor's entries as sent. Both name its statistics.
	rule    *limits.Rule
	entries []limits.Entry
	// cost is the hits to record (or to give back, with refund).
	cost   uint64
	refund bool
	// neverFits: cost is above limit. The engine only peeks, for the
	// remaining count, and the answer is OVER_LIMIT.
	neverFits bool
	// check is the index of the descriptor's engine check.
	check int
}

// shouldRateLimit validates req, resolves each descriptor's limit, decides
// them in one engine call and builds the response. On error nothing was
// recorded.
func (s *Server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, t *trafficCall) (*rlsv3.RateLimitResponse, error) {
	n := len(req.Descriptors)
	switch {
	case req.Domain == "":
		return nil, badInput("domain is empty: set the domain of Envoy's rate limit filter (it names the limits file's domain)")
	case n == 0:
		return nil, badInput("no descriptors: a rate limit request needs at least one descriptor")
	case n > s.maxBatch():
		return nil, badInput("%d descriptors in one request; the maximum is %d: send fewer rate limit actions per route", n, s.maxBatch())
	}
	var cfg *limits.Config // nil matches nothing
	if s.limits != nil {
		cfg = s.limits.Current() // one snapshot for the whole request
	}
	now := s.clock.Now()
	t.now = now
	bounds := s.engineLimits()

	descs := make([]envoyDescriptor, n)
	rules := make([]*limits.Rule, n)
	counted := make([][]limits.Entry, n) // the entries each descriptor is counted under
	nentries := 0
	for _, pd := range req.Descriptors {
		nentries += len(pd.GetEntries())
	}
	all := make([]limits.Entry, 0, nentries) // every descriptor's entries, one allocation
	for i, pd := range req.Descriptors {
		var entries []limits.Entry
		var err error
		if entries, all, err = envoyEntries(i, pd, all); err != nil {
			return nil, err
		}
		d := &descs[i]
		d.cost, d.refund = envoyCost(pd, req.HitsAddend), pd.GetIsNegativeHits()
		d.entries = entries
		counted[i] = entries
		if pd.GetLimit() != nil {
			if err := inlineLimit(i, pd.GetLimit(), bounds, d); err != nil {
				return nil, err
			}
		} else if rule, key, ok := cfg.Match(req.Domain, entries); ok {
			rules[i], counted[i] = rule, key
		}
	}
	rules = limits.ApplyReplaces(rules)

	checks := make([]actor.Check, 0, n)
	checkDesc := make([]int, 0, n) // descriptor of each check
	var leased []bool              // checks of lease rules, when any
	for i := range descs {
		d := &descs[i]
		d.key = envoyKey(req.Domain, counted[i])
		d.usage = s.usageAll || s.usageDomains[req.Domain]
		if r := rules[i]; r != nil {
			d.name, d.shadow, d.quota = r.Name, r.ShadowMode, r.QuotaMode
			d.usage = d.usage || r.Usage
			if r.Unlimited {
				d.kind = envoyUnlimited
			} else {
				d.kind, d.limit, d.window, d.unit, d.mult = envoyCheck, r.Limit, r.Window, r.Unit, 1
				d.meta, d.rule = r.Metadata, r
			}
		}
		d.shadow = d.shadow || s.cfg.ShadowMode
		if o := s.overrides.Match(d.key, now); o != nil {
			c := actor.Check{Limit: d.limit, Window: d.window, Algorithm: d.algo}
			o.Apply(&c)
			if c.Limit > 0 && c.Window > 0 {
				if c.Window != d.window {
					d.unit, d.mult = windowUnit(c.Window)
				}
				d.kind, d.limit, d.window, d.algo = envoyCheck, c.Limit, c.Window, c.Algorithm
			}
		}
		if d.kind != envoyCheck {
			continue
		}
		if len(d.key) > bounds.MaxKeyLen {
			return nil, badInput("descriptor %d (%s...): its key is %d bytes encoded, above the maximum of %d: send shorter values (for example a hash of a long header) or raise the engine's max key length",
				i, d.key[:min(len(d.key), 64)], len(d.key), bounds.MaxKeyLen)
		}
		if d.limit == 0 {
			d.kind = envoyBlocked
			continue
		}
		c := actor.Check{Key: d.key, Limit: d.limit, Window: d.window, Algorithm: d.algo, Refund: d.refund, Usage: d.usage && !d.refund}
		switch {
		case d.refund:
			c.Cost = int64(min(d.cost, math.MaxInt64)) // a refund never takes the count below zero
		case c.Usage:
			c.Cost = int64(min(d.cost, math.MaxInt64)) // spent: recorded whatever the limit
		case d.cost > uint64(d.limit):
			d.neverFits = true // peek, for limit_remaining
		default:
			c.Cost = int64(d.cost)
		}
		d.check = len(checks)
		if d.rule != nil && d.rule.Lease || s.leaseHot(d.key) {
			if leased == nil {
				leased = make([]bool, n)
			}
			leased[len(checks)] = true
		}
		checks = append(checks, c)
		checkDesc = append(checkDesc, i)
	}

	for _, c := range checks {
		if c.Refund && c.Cost > 0 {
			if err := s.mayRefund(ctx); err != nil {
				return nil, err
			}
			break
		}
	}
	out := make([]actor.Decision, len(checks))
	if len(checks) > 0 {
		decide := s.decide
		if leased != nil {
			decide = func(ctx context.Context, checks []actor.Check, out []actor.Decision, nodes []string, _ bool) error {
				return s.decideLeased(ctx, checks, out, nodes, leased)
			}
		}
		if err := decide(ctx, checks, out, nil, false); err != nil {
			var ice *actor.InvalidCheckError
			if errors.As(err, &ice) && ice.Index < len(checkDesc) {
				i := checkDesc[ice.Index]
				return nil, badInput("descriptor %d (key %s): %s: %s", i, descs[i].key, ice.Field, ice.Reason)
			}
			return nil, err
		}
		// Envoy has no per-descriptor error: a check that could not be
		// decided (a damaged record) fails the request, with its status
		// (the others were decided), and Envoy applies its failure mode.
		for i := range out {
			if out[i].Err != nil {
				return nil, out[i].Err
			}
		}
	}
	resp := s.envoyResponse(req.Domain, descs, out)
	if s.cfg.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, descs, resp.Statuses)
	}
	t.descs, t.resp = descs, resp
	return resp, nil
}

// envoyOutcome is the decision on one descriptor that has a limit.
type envoyOutcome struct {
	d         *envoyDescriptor
	allowed   bool
	remaining int64
	reset     time.Duration
	retry     time.Duration // when denied; meaningless when neverFits
	neverFits bool          // denied whatever happens: no retry helps
}

// envoyResponse builds the response from the descriptors of a request of
// domain and the engine's decisions, and counts the decisions.
func (s *Server) envoyResponse(domain string, descs []envoyDescriptor, out []actor.Decision) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	// The messages of the statuses, allocated together: a response costs a
	// few allocations, not a few per descriptor.
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(descs))
	var limitsOut []rlsv3.RateLimitResponse_RateLimit
	var resets []durationpb.Duration
	for i := range descs {
		if k := descs[i].kind; k == envoyCheck || k == envoyBlocked {
			limitsOut = make([]rlsv3.RateLimitResponse_RateLimit, len(descs))
			resets = make([]durationpb.Duration, len(descs))
			break
		}
	}
	var allowed, denied, shadowDenied int
	var reports, reportsOver int
	var reportedHits float64
	var enforced []envoyOutcome // outcomes of the limited, non-shadow descriptors
	overLimit := false
	quotaTotal, quotaDenied := 0, 0
	for i := range descs {
		d := &descs[i]
		var o envoyOutcome
		switch d.kind {
		case envoyNoLimit:
			st := &statuses[i]
			st.Code = rlsv3.RateLimitResponse_OK
			resp.Statuses[i] = st
			allowed++
			continue
		case envoyUnlimited:
			st := &statuses[i]
			st.Code, st.LimitRemaining = rlsv3.RateLimitResponse_OK, math.MaxUint32
			resp.Statuses[i] = st
			allowed++
			continue
		case envoyBlocked:
			o = envoyOutcome{d: d, allowed: d.refund, reset: d.window, neverFits: !d.refund}
		case envoyCheck:
			dec := &out[d.check]
			o = envoyOutcome{d: d, allowed: dec.Allowed && !d.neverFits, remaining: dec.Remaining,
				reset: dec.ResetAfter, retry: dec.RetryAfter, neverFits: d.neverFits}
		}
		s.ruleStats.count(domain, &o)
		if d.usage && !d.refund && d.cost > 0 && d.kind == envoyCheck {
			reports++
			reportedHits += float64(d.cost)
			if !o.allowed {
				reportsOver++
			}
		}
		code := rlsv3.RateLimitResponse_OK
		switch {
		case o.allowed:
			allowed++
		case d.shadow:
			shadowDenied++ // as envoyproxy/ratelimit: reported OK, counted apart
			s.logShadowDenial(d)
		default:
			denied++
			code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if !d.shadow {
			enforced = append(enforced, o)
			if d.quota {
				quotaTotal++
				if !o.allowed {
					quotaDenied++
				}
			} else if !o.allowed {
				overLimit = true
			}
		}
		st := &statuses[i]
		st.Code = code
		st.CurrentLimit = currentLimit(d, &limitsOut[i])
		st.LimitRemaining = clampUint32(o.remaining)
		st.DurationUntilReset = setDuration(&resets[i], o.reset)
		resp.Statuses[i] = st
	}
	// quota_mode (an envoyproxy/ratelimit extension): quota descriptors fail
	// the request only when all of them are over their limit.
	overLimit = overLimit || (quotaTotal > 0 && quotaDenied == quotaTotal)
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	if overLimit {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.cfg.RateLimitHeaders {
		resp.ResponseHeadersToAdd = s.rateLimitHeaders(enforced, overLimit)
	}
	m := &s.metrics.envoy
	m.allowed.Add(float64(allowed))
	m.denied.Add(float64(denied))
	if shadowDenied > 0 {
		m.shadowDenied.Add(float64(shadowDenied))
	}
	if reports > 0 {
		u := &s.metrics.usage
		u.reports.WithLabelValues("envoy").Add(float64(reports))
		u.reportedHits.WithLabelValues("envoy").Add(reportedHits)
		if reportsOver > 0 {
			u.overLimit.WithLabelValues("envoy").Add(float64(reportsOver))
		}
	}
	return resp
}

// logShadowDenial logs, at debug level, a descriptor over its limit that
// shadow mode answered OK.
func (s *Server) logShadowDenial(d *envoyDescriptor) {
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("shadow mode: over the limit, answered OK", "key", d.key, "rule", d.name, "limit", d.limit, "window", d.window)
	}
}

// currentLimit describes d's limit for the response in rl, and returns rl.
func currentLimit(d *envoyDescriptor, rl *rlsv3.RateLimitResponse_RateLimit) *rlsv3.RateLimitResponse_RateLimit {
	rl.Name = d.name
	rl.RequestsPerUnit = clampUint32(d.limit)
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_Unit(d.unit)
	if d.mult > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(d.mult)
	}
	return rl
}

// setDuration sets dst to d, as durationpb.New does, and returns dst.
func setDuration(dst *durationpb.Duration, d time.Duration) *durationpb.Duration {
	dst.Seconds = int64(d / time.Second)
	dst.Nanos = int32(d % time.Second)
	return dst
}

// envoyEntries checks descriptor i's entries, appends them to all and
// returns them and all. Values may be empty (as in envoyproxy/ratelimit,
// where an empty value matches the key's default descriptor); keys may not
// (Envoy's API requires them).
func envoyEntries(i int, pd *ratelimitv3.RateLimitDescriptor, all []limits.Entry) (entries, _ []limits.Entry, _ error) {
	pes := pd.GetEntries()
	if len(pes) == 0 {
		return nil, all, badInput("descriptor %d has no entries: a descriptor needs at least one key and value", i)
	}
	start := len(all)
	for j, pe := range pes {
		if pe.GetKey() == "" {
			return nil, all, badInput("descriptor %d, entry %d: the key is empty: every entry needs a key (its value may be empty)", i, j)
		}
		all = append(all, limits.Entry{Key: pe.GetKey(), Value: pe.GetValue()})
	}
	return all[start:len(all):len(all)], all, nil
}

// envoyCost returns a descriptor's hits: its own hits_addend when set (0
// peeks), else the request's hits_addend, where 0 means 1 as in Envoy.
func envoyCost(pd *ratelimitv3.RateLimitDescriptor, requestHits uint32) uint64 {
	if h := pd.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return uint64(max(requestHits, 1))
}

// inlineLimit reads descriptor i's limit override into d. The unit is one
// of Envoy's; 7, which Envoy's response enum names WEEK, is read as a week.
func inlineLimit(i int, l *ratelimitv3.RateLimitDescriptor_RateLimitOverride, bounds actor.Limits, d *envoyDescriptor) error {
	unit := limits.Unit(l.GetUnit())
	unitLen := unit.Duration()
	if unitLen == 0 {
		return badInput("descriptor %d: limit: unit %v is not a time unit: use SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", i, l.GetUnit())
	}
	mult := uint32(1)
	if m := l.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return badInput("descriptor %d: limit: unit_multiplier is 0: it must be at least 1 (unset means 1)", i)
		}
		mult = m.GetValue()
	}
	if time.Duration(mult) > bounds.MaxWindow/unitLen {
		return badInput("descriptor %d: limit: %d × %s is longer than the longest window, %v: lower unit_multiplier", i, mult, unit, bounds.MaxWindow)
	}
	window := time.Duration(mult) * unitLen
	if window < bounds.MinWindow {
		return badInput("descriptor %d: limit: %d × %s is shorter than the shortest window, %v: raise unit_multiplier", i, mult, unit, bounds.MinWindow)
	}
	d.kind, d.limit, d.window, d.unit, d.mult = envoyCheck, int64(l.GetRequestsPerUnit()), window, unit, mult
	return nil
}

// windowUnit describes a window as a unit and a multiplier for
// current_limit: the longest unit that divides it exactly; a window that is
// not a whole number of seconds is rounded up to one (so that a client that
// paces itself by it never goes over).
func windowUnit(w time.Duration) (limits.Unit, uint32) {
	secs := (w + time.Second - 1) / time.Second
	if w%time.Second == 0 {
		for _, u := range []limits.Unit{limits.UnitYear, limits.UnitMonth, limits.UnitWeek, limits.UnitDay, limits.UnitHour, limits.UnitMinute} {
			if n := w / u.Duration(); w%u.Duration() == 0 && n <= math.MaxUint32 {
				return u, uint32(n)
			}
		}
	}
	return limits.UnitSecond, uint32(min(secs, math.MaxUint32))
}

func clampUint32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

// rateLimitHeaders returns the header fields of s's HeaderFormat for the
// most restrictive enforced descriptor, nil when there is none.
// Shadow-mode descriptors never show.
func (s *Server) rateLimitHeaders(enforced []envoyOutcome, overLimit bool) []*corev3.HeaderValue {
	best := mostRestrictive(enforced, overLimit)
	switch {
	case best == nil:
		return nil
	case s.cfg.HeaderFormat == HeadersDraft03:
		return draft03Headers(s.headerNames, best)
	}
	return ietfHeaders(best, overLimit)
}

// mostRestrictive returns the outcome the response headers describe: when
// the request is over its limit, the one that fails it for longest (a
// descriptor that can never fit beats any wait; when only quota-mode
// descriptors fail the request, the one that frees up first); otherwise
// the one with the fewest hits remaining. It returns nil when enforced is
// empty.
func mostRestrictive(enforced []envoyOutcome, overLimit bool) *envoyOutcome {
	var best *envoyOutcome
	if overLimit {
		for i := range enforced {
			o := &enforced[i]
			if !o.allowed && !o.d.quota && (best == nil || longerWait(o, best)) {
				best = o
			}
		}
		if best == nil {
			for i := range enforced {
				o := &enforced[i]
				if !o.allowed && (best == nil || longerWait(best, o)) {
					best = o
				}
			}
		}
	} else {
		for i := range enforced {
			if o := &enforced[i]; best == nil || o.remaining < best.remaining {
				best = o
			}
		}
	}
	return best
}

// wait is the time the headers announce: until a retry can succeed when
// denied (and waiting helps), else until the limit is whole again.
func (o *envoyOutcome) wait() time.Duration {
	if !o.allowed && !o.neverFits {
		return o.retry
	}
	return o.reset
}

// ietfHeaders returns the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers for best, and Retry-After when the
// request is over its limit and waiting can help.
func ietfHeaders(best *envoyOutcome, overLimit bool) []*corev3.HeaderValue {
	name := best.d.name
	if name == "" {
		name = "default"
	}
	policy := sfString(name)
	// t is the time within which the client can use no more than r.
	t := best.wait()
	h := []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: policy + ";q=" + strconv.FormatInt(best.d.limit, 10) + ";w=" + strconv.FormatInt(ceilSeconds(best.d.window), 10)},
		{Key: "RateLimit", Value: policy + ";r=" + strconv.FormatInt(max(best.remaining, 0), 10) + ";t=" + strconv.FormatInt(ceilSeconds(t), 10)},
	}
	if overLimit && !best.allowed && !best.neverFits {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(max(ceilSeconds(best.retry), 1), 10)})
	}
	return h
}

// longerWait reports whether a denied a waits longer than a denied b.
func longerWait(a, b *envoyOutcome) bool {
	switch {
	case b.neverFits:
		return false
	case a.neverFits:
		return true
	}
	return a.retry > b.retry
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((max(d, 0) + time.Second - 1) / time.Second)
}

// sfString returns s as a structured-field String (RFC 8941): quoted, with
// '"' and '\' escaped and the bytes a String cannot hold replaced by '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
