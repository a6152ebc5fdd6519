package httplimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/client"
)

// Checker asks Sluice for decisions: a *client.Client, or a fake in
// tests.
type Checker interface {
	Check(ctx context.Context, ch client.Check, opts ...client.Option) (client.Decision, error)
	CheckAll(ctx context.Context, checks []client.Check, opts ...client.Option) ([]client.Decision, error)
}

// Rule limits the requests that have a value for Key to Limit per Window,
// counted per value.
type Rule struct {
	// Name names the rule: in the Sluice keys it counts under (so that two
	// rules never share a counter), in the RateLimit-Policy header, in
	// logs and metrics. Required, unique within a Limiter; letters,
	// digits, '_', '-' and '.'.
	Name string
	// Key is what requests are counted by. Required.
	Key Key
	// Limit is the number of requests allowed per Window for each value of
	// Key; positive.
	Limit int64
	// Window is the length of the sliding window, from 1ms.
	Window time.Duration
	// Algorithm is how Sluice counts; the zero value lets the server choose
	// (the exact sliding log unless an override says otherwise).
	Algorithm client.Algorithm
	// Cost is what one request costs. 0 means 1; with ResponseCost it
	// must be 0.
	Cost int64
	// ResponseCost, if set, makes the rule a budget spent after the fact:
	// a request goes through while the budget is below its limit, and
	// what its response reports it cost (a header or trailer) is recorded
	// once the handler returned, even over the limit. See ResponseCost.
	ResponseCost ResponseCost
	// OnFailure is the decision when Sluice does not decide this rule
	// (slow, down, an error): client.FailOpen or client.FailClosed. The
	// zero value takes Config.OnFailure.
	OnFailure client.Policy
	// Shadow counts requests and logs the ones the rule would deny, but
	// never denies them, adds no header and spends nothing of the enforced
	// rules: for rolling a rule out.
	Shadow bool
	// Lease, if set, decides the rule's keys from quota leases that this
	// process holds (client.Lease): slices of each key's room, spent here
	// one request at a time without a call. For a hot key that every
	// request checks (a Const or a Route key: a service-wide or tenant-
	// wide limit), not for keys with a value per client. Needs a Client
	// that leases (*client.Client), a cost of 0 or 1, no ResponseCost, not
	// Shadow, and not client.SlidingWindow. See docs/edge.md "Quota
	// leases".
	Lease *client.LeaseConfig
}

// Config configures a Limiter. It is not modified after New.
type Config struct {
	// Client asks Sluice; usually a *client.Client. Required.
	Client Checker
	// Rules are the rules every request goes through: it is let through
	// only if every enforced rule that applies to it allows it. Several
	// enforced rules are decided in one all-or-nothing call, so that a
	// request one rule denies spends nothing of the others.
	Rules []Rule
	// KeyPrefix starts every Sluice key, so that the limits of different
	// services sharing a Sluice cluster stay apart. Default "http|".
	KeyPrefix string
	// OnFailure is the failure policy of the rules that set none. Zero:
	// the client's (Config.OnFailure of the client: FailOpen unless set).
	OnFailure client.Policy
	// TrustedProxies are the addresses of the proxies in front of this
	// server (load balancers, CDNs) whose Forwarded and X-Forwarded-For
	// headers ClientIP believes. Default none: the headers are ignored,
	// since any client can send them.
	TrustedProxies []netip.Prefix
	// IPv6PrefixLen is the prefix an IPv6 client is counted by, since one
	// subscriber usually holds a whole /64. Default 64; 128 counts each
	// address.
	IPv6PrefixLen int
	// RetryAfterHeadroom is added to the retry_after Sluice gives before it
	// is sent as Retry-After, so that clients that come back at exactly
	// Retry-After find the limit free. Default 2s; negative means none.
	RetryAfterHeadroom time.Duration
	// RetryAfterJitter is the most random time added to Retry-After (a
	// uniform draw from 0 to it, in whole seconds), so that clients denied
	// together do not come back together. Default 3s; negative means none.
	RetryAfterJitter time.Duration
	// MaxBodyBytes is the most of a request body that Form keys read.
	// Default 64 KiB.
	MaxBodyBytes int64
	// Denied, if set, writes the response of a denied request instead of
	// the RFC 9457 problem details. The RateLimit, Retry-After and
	// Cache-Control headers are already set; it writes the status.
	Denied func(w http.ResponseWriter, r *http.Request, retryAfter time.Duration)
	// Observe, if set, is called after each request's decision (before the
	// handler runs, or the denial is written), for metrics.
	Observe func(r *http.Request, res *Result)
	// ObserveUsage, if set, is called for each cost a response reported
	// (rules with a ResponseCost), after Sluice recorded it, for metrics.
	ObserveUsage func(rep *UsageReport)
	// Logger receives the would-be denials of shadow rules and Sluice's
	// failures, each at most once a second per rule with the count of
	// those not logged. nil discards them.
	Logger *slog.Logger
	// Rand returns a uniform float64 in [0, 1) for the jitter; nil uses
	// math/rand/v2.
	Rand func() float64
	// MaxLeases bounds the keys of Lease rules held at once; the next
	// keys are checked with a call each, as without a lease. Default
	// 1024.
	MaxLeases int
}

// Leaser holds quota leases: a *client.Client. Config.Client must be one
// when a rule has a Lease.
type Leaser interface {
	Lease(ch client.Check, cfg client.LeaseConfig) (*client.Lease, error)
}

// Result is the decision on one request.
type Result struct {
	// Allowed says whether the request goes through.
	Allowed bool
	// Rules holds the decision of each rule that applied, enforced rules
	// first, in the order of Config.Rules.
	Rules []RuleResult
	// RetryAfter is the Retry-After sent with a denial (jitter and headroom
	// included); 0 when allowed.
	RetryAfter time.Duration
	// Took is the time the decision took.
	Took time.Duration
	// Err is Sluice's failure, if it did not decide a rule.
	Err error
}

// RuleResult is the decision of one rule on a request.
type RuleResult struct {
	// Rule is the rule.
	Rule *Rule
	// Key is the Sluice key it counted the request under.
	Key string
	// Decision is Sluice's decision (or the cache's, or the failure
	// policy's).
	Decision client.Decision
}

// Limiter is net/http middleware that limits requests by rules, asking
// Sluice. It is safe for concurrent use.
type Limiter struct {
	cfg      Config
	log      *slog.Logger
	rand     func() float64
	enforced []int // indexes of enforced rules in cfg.Rules
	shadow   []int
	logs     []logLimiter // one per rule
	// usage: a rule has a ResponseCost.
	usage bool

	leaseMu sync.Mutex
	leases  map[string]*client.Lease // by Sluice key; nil once closed
}

// New returns a Limiter of cfg, or an error naming every bad field.
func New(cfg Config) (*Limiter, error) {
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "http|"
	}
	if cfg.IPv6PrefixLen == 0 {
		cfg.IPv6PrefixLen = 64
	}
	if cfg.RetryAfterHeadroom == 0 {
		cfg.RetryAfterHeadroom = 2 * time.Second
	}
	if cfg.RetryAfterJitter == 0 {
		cfg.RetryAfterJitter = 3 * time.Second
	}
	cfg.RetryAfterHeadroom = max(cfg.RetryAfterHeadroom, 0)
	cfg.RetryAfterJitter = max(cfg.RetryAfterJitter, 0)
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 64 << 10
	}
	if cfg.MaxLeases == 0 {
		cfg.MaxLeases = 1024
	}
	cfg.Rules = append([]Rule(nil), cfg.Rules...)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg, log: cfg.Logger, rand: cfg.Rand, logs: make([]logLimiter, len(cfg.Rules)), leases: map[string]*client.Lease{}}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.rand == nil {
		l.rand = rand.Float64
	}
	for i := range cfg.Rules {
		l.usage = l.usage || !cfg.Rules[i].ResponseCost.IsZero()
		if cfg.Rules[i].Shadow {
			l.shadow = append(l.shadow, i)
		} else {
			l.enforced = append(l.enforced, i)
		}
	}
	return l, nil
}

// validate reports every bad field at once.
func (c *Config) validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("httplimit: config: Client is nil"))
	}
	if c.IPv6PrefixLen < 0 || c.IPv6PrefixLen > 128 {
		errs = append(errs, fmt.Errorf("httplimit: config: IPv6PrefixLen %d: want 0 to 128", c.IPv6PrefixLen))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("httplimit: config: MaxBodyBytes %d is negative", c.MaxBodyBytes))
	}
	if c.OnFailure > client.FailClosed {
		errs = append(errs, fmt.Errorf("httplimit: config: OnFailure %v: want FailOpen or FailClosed", c.OnFailure))
	}
	if c.MaxLeases < 0 {
		errs = append(errs, fmt.Errorf("httplimit: config: MaxLeases %d is negative", c.MaxLeases))
	}
	seen := map[string]bool{}
	for i := range c.Rules {
		r := &c.Rules[i]
		if err := r.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("httplimit: rule %d: %w", i, err))
		}
		if _, ok := c.Client.(Leaser); r.Lease != nil && c.Client != nil && !ok {
			errs = append(errs, fmt.Errorf("httplimit: rule %d: a lease needs a Client that leases (a *client.Client); %T does not", i, c.Client))
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("httplimit: rule %d: name %q is used twice", i, r.Name))
		}
		seen[r.Name] = true
	}
	return errors.Join(errs...)
}

// Validate reports what is wrong with a rule.
func (r *Rule) Validate() error {
	var errs []string
	if r.Name == "" {
		errs = append(errs, "name is empty")
	}
	for _, c := range r.Name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			errs = append(errs, fmt.Sprintf("name %q: use letters, digits, '_', '-' and '.'", r.Name))
			break
		}
	}
	if r.Key.IsZero() {
		errs = append(errs, "no key")
	}
	if r.Limit <= 0 {
		errs = append(errs, fmt.Sprintf("limit %d: want a positive count", r.Limit))
	}
	if r.Window < time.Millisecond {
		errs = append(errs, fmt.Sprintf("window %v: want 1ms or more", r.Window))
	}
	if r.Cost < 0 || r.Cost > r.Limit && r.Limit > 0 {
		errs = append(errs, fmt.Sprintf("cost %d: want 0 to the limit", r.Cost))
	}
	if !r.ResponseCost.IsZero() && r.Cost != 0 {
		errs = append(errs, fmt.Sprintf("cost %d with a response cost: the request asks only whether the budget has room (leave cost at 0)", r.Cost))
	}
	if r.OnFailure > client.FailClosed {
		errs = append(errs, fmt.Sprintf("on failure %v: want open or closed", r.OnFailure))
	}
	if r.Lease != nil {
		switch {
		case r.Cost > 1:
			errs = append(errs, fmt.Sprintf("cost %d with a lease: a leased request spends one hit", r.Cost))
		case !r.ResponseCost.IsZero():
			errs = append(errs, "a lease with a response cost: leases spend a hit per request, known in advance")
		case r.Shadow:
			errs = append(errs, "a shadow rule takes no lease: lease it once it is enforced")
		case r.Algorithm == client.SlidingWindow:
			errs = append(errs, "sliding_window takes no leases (its count is an estimate); use sliding_log or token_bucket")
		case r.Lease.Slice < 0 || r.Lease.TTL < 0:
			errs = append(errs, fmt.Sprintf("lease slice %d and TTL %v must not be negative", r.Lease.Slice, r.Lease.TTL))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Rules returns the limiter's rules. They must not be changed.
func (l *Limiter) Rules() []Rule { return l.cfg.Rules }

// Wrap returns next limited by l: the middleware form,
// func(http.Handler) http.Handler, that routers take. The costs of rules
// with a ResponseCost are reported when next returns (ServeNext).
func (l *Limiter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.ServeNext(w, r, next)
	})
}

// Serve decides r: it sets the RateLimit headers on w and, if r is denied,
// writes the 429 and returns false; if r is allowed, it returns true and
// the caller serves it. It does not report response costs: use ServeNext,
// or Decide and Report.
func (l *Limiter) Serve(w http.ResponseWriter, r *http.Request) bool {
	res := l.Decide(r)
	return l.respond(w, r, &res)
}

// respond sets the headers of res on w, writes the denial if it is one,
// and reports whether r goes through.
func (l *Limiter) respond(w http.ResponseWriter, r *http.Request, res *Result) bool {
	h := w.Header()
	l.setHeaders(h, res)
	if !res.Allowed {
		secs := strconv.FormatInt(int64(res.RetryAfter/time.Second), 10)
		h.Set("Retry-After", secs)
		h.Set("Cache-Control", "no-store")
		if l.cfg.Denied != nil {
			l.cfg.Denied(w, r, res.RetryAfter)
		} else {
			writeProblem(w, secs)
		}
	}
	return res.Allowed
}

// Decide asks Sluice about r under every rule that applies and returns the
// decision, without writing anything. Enforced rules go in one call (all
// or nothing when there are several); shadow rules go at the same time,
// each in a coalesced call of its own. Rules with a Lease are decided
// first, from their slices; when one of them denies, the others are not
// asked, and when another rule denies, their hits go back to their
// slices, so that a denied request spends nothing.
func (l *Limiter) Decide(r *http.Request) Result {
	start := time.Now()
	x := extract{l: l}
	res := Result{Allowed: true}
	var checks [4]client.Check
	enforced := checks[:0]
	var plainAt [4]int
	plain := plainAt[:0] // where in res.Rules the checks of enforced are
	var leased []leasedRule
	var results [4]RuleResult
	res.Rules = results[:0]
	for _, i := range l.enforced {
		rule := &l.cfg.Rules[i]
		if key, ok := rule.Key.fn(r, &x); ok {
			ch := l.check(rule, key)
			if rule.Lease != nil {
				if ls := l.lease(rule, ch); ls != nil {
					leased = append(leased, leasedRule{len(res.Rules), ls, ch})
					res.Rules = append(res.Rules, RuleResult{Rule: rule, Key: ch.Key})
					continue
				}
			}
			plain = append(plain, len(res.Rules))
			enforced = append(enforced, ch)
			res.Rules = append(res.Rules, RuleResult{Rule: rule, Key: ch.Key})
		}
	}
	nEnforced := len(res.Rules)
	var shadow []client.Check
	for _, i := range l.shadow {
		rule := &l.cfg.Rules[i]
		if key, ok := rule.Key.fn(r, &x); ok {
			shadow = append(shadow, l.check(rule, key))
			res.Rules = append(res.Rules, RuleResult{Rule: rule, Key: shadow[len(shadow)-1].Key})
		}
	}
	if len(res.Rules) == 0 {
		res.Took = time.Since(start)
		l.observe(r, &res)
		return res
	}
	ctx := r.Context()
	var wg sync.WaitGroup
	var shadowErr error
	if len(shadow) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shadowErr = l.decideShadow(ctx, shadow, res.Rules[nEnforced:])
		}()
	}
	var err error
	denied := false
	for _, lr := range leased {
		d := &res.Rules[lr.at].Decision
		var e error
		*d, e = lr.lease.Allow(ctx)
		if errors.Is(e, client.ErrClosed) {
			// Closed under this request (Close, a reload of sluice
			// edge's rules): asked with a call instead.
			*d, e = l.cfg.Client.Check(ctx, lr.check)
		}
		err = errors.Join(err, e)
		if !d.Allowed {
			denied = true
			break
		}
	}
	if denied {
		// The rules not asked: no decision, and nothing spent.
		for _, lr := range leased {
			if d := &res.Rules[lr.at].Decision; d.Source == 0 {
				*d = client.Decision{Remaining: -1}
			}
		}
		for _, at := range plain {
			res.Rules[at].Decision = client.Decision{Remaining: -1}
		}
	} else {
		var e error
		switch len(enforced) {
		case 0:
		case 1:
			res.Rules[plain[0]].Decision, e = l.cfg.Client.Check(ctx, enforced[0])
		default:
			var ds []client.Decision
			ds, e = l.cfg.Client.CheckAll(ctx, enforced)
			for i := range ds {
				res.Rules[plain[i]].Decision = ds[i]
			}
		}
		err = errors.Join(err, e)
	}
	wg.Wait()
	res.Err = errors.Join(err, shadowErr)
	var retry time.Duration
	for i := range res.Rules[:nEnforced] {
		d := &res.Rules[i].Decision
		if !d.Allowed {
			res.Allowed = false
			retry = max(retry, d.RetryAfter)
		}
		if d.Source == client.SourceFailure {
			l.logFailure(&res.Rules[i], err)
		}
	}
	if !res.Allowed {
		res.RetryAfter = l.retryAfter(retry)
		for _, lr := range leased {
			lr.lease.GiveBack(res.Rules[lr.at].Decision)
		}
	}
	for i := range res.Rules[nEnforced:] {
		rr := &res.Rules[nEnforced+i]
		if !rr.Decision.Allowed && rr.Decision.Source != client.SourceFailure {
			l.logShadow(rr)
		}
	}
	res.Took = time.Since(start)
	l.observe(r, &res)
	return res
}

// leasedRule is an enforced rule of a request decided from a lease: its
// place in Result.Rules, its lease and its check.
type leasedRule struct {
	at    int
	lease *client.Lease
	check client.Check
}

// lease returns the lease of ch's key, taken on first use, or nil when
// MaxLeases are held or the limiter is closed (the key is then checked
// with a call).
func (l *Limiter) lease(rule *Rule, ch client.Check) *client.Lease {
	l.leaseMu.Lock()
	defer l.leaseMu.Unlock()
	if ls, ok := l.leases[ch.Key]; ok || l.leases == nil || len(l.leases) >= l.cfg.MaxLeases {
		return ls
	}
	ls, err := l.cfg.Client.(Leaser).Lease(ch, *rule.Lease)
	if err != nil {
		return nil // what Lease refuses, New refused first
	}
	l.leases[ch.Key] = ls
	return ls
}

// Close settles the leases of the Lease rules' keys, within ctx; their
// keys are checked with a call each from then on. Call it when the
// server stops: a slice not settled keeps its unspent hits counted until
// it expires (never over the limit, but room lost).
func (l *Limiter) Close(ctx context.Context) error {
	l.leaseMu.Lock()
	leases := l.leases
	l.leases = nil
	l.leaseMu.Unlock()
	var errs []error
	for _, ls := range leases {
		errs = append(errs, ls.Close(ctx))
	}
	return errors.Join(errs...)
}

// decideShadow decides shadow checks, each on its own (a shadow rule that
// would deny must not stop the others from counting).
func (l *Limiter) decideShadow(ctx context.Context, checks []client.Check, out []RuleResult) error {
	var errs []error
	for i := range checks {
		d, err := l.cfg.Client.Check(ctx, checks[i], client.WithPolicy(client.FailOpen))
		out[i].Decision = d
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// check is the Sluice check of rule on a request whose key value is key.
func (l *Limiter) check(rule *Rule, key string) client.Check {
	policy := rule.OnFailure
	if policy == client.PolicyDefault {
		policy = l.cfg.OnFailure
	}
	return client.Check{
		Key:       sluiceKey(l.cfg.KeyPrefix, rule.Name, key),
		Limit:     rule.Limit,
		Window:    rule.Window,
		Algorithm: rule.Algorithm,
		Cost:      rule.Cost,
		OnFailure: policy,
		// A budget spent after the fact: is it below its limit?
		Peek:  !rule.ResponseCost.IsZero(),
		Usage: !rule.ResponseCost.IsZero(),
	}
}

// retryAfter is the Retry-After of a denial whose longest retry_after is
// retry: rounded up to whole seconds (at least 1), plus the headroom, plus
// a random jitter, in whole seconds.
func (l *Limiter) retryAfter(retry time.Duration) time.Duration {
	secs := max((retry+time.Second-1)/time.Second, 1)
	secs += (l.cfg.RetryAfterHeadroom + time.Second - 1) / time.Second
	if j := int64(l.cfg.RetryAfterJitter / time.Second); j > 0 {
		secs += time.Duration(min(int64(l.rand()*float64(j+1)), j))
	}
	return secs * time.Second
}

func (l *Limiter) observe(r *http.Request, res *Result) {
	if l.cfg.Observe != nil {
		l.cfg.Observe(r, res)
	}
}

// setHeaders sets RateLimit-Policy (every enforced rule that applied) and
// RateLimit (those Sluice decided) of draft-ietf-httpapi-ratelimit-headers.
func (l *Limiter) setHeaders(h http.Header, res *Result) {
	var policy, state []byte
	for i := range res.Rules {
		rr := &res.Rules[i]
		if rr.Rule.Shadow {
			continue
		}
		d := &rr.Decision
		limit := rr.Rule.Limit
		if d.Known() && d.Limit > 0 {
			limit = d.Limit
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
		}
		policy = appendSFString(policy, rr.Rule.Name)
		policy = append(policy, ";q="...)
		policy = strconv.AppendInt(policy, limit, 10)
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, ceilSeconds(rr.Rule.Window), 10)
		if !d.Known() {
			continue
		}
		t := d.ResetAfter
		if !d.Allowed && d.RetryAfter > 0 {
			t = d.RetryAfter
		}
		if len(state) > 0 {
			state = append(state, ", "...)
		}
		state = appendSFString(state, rr.Rule.Name)
		state = append(state, ";r="...)
		state = strconv.AppendInt(state, max(d.Remaining, 0), 10)
		state = append(state, ";t="...)
		state = strconv.AppendInt(state, ceilSeconds(t), 10)
	}
	if len(policy) > 0 {
		h.Set("RateLimit-Policy", string(policy))
	}
	if len(state) > 0 {
		h.Set("RateLimit", string(state))
	}
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	return int64((max(d, 0) + time.Second - 1) / time.Second)
}

// appendSFString appends s as a structured-field String (RFC 8941).
// Rule names are validated to need no escaping.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// writeProblem writes the 429 as RFC 9457 problem details: that the
// request was limited and when to retry, nothing about the rule.
func writeProblem(w http.ResponseWriter, secs string) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Fprintf(w, `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Too many requests. Retry after %s seconds."}`+"\n", secs)
}

// logLimiter lets one line a second through and counts the others.
type logLimiter struct {
	last       atomic.Int64 // unix ns of the last line
	suppressed atomic.Int64
}

// allow reports whether to log now, and how many lines were dropped since
// the last one.
func (ll *logLimiter) allow() (bool, int64) {
	now := time.Now().UnixNano()
	last := ll.last.Load()
	if now-last < int64(time.Second) || !ll.last.CompareAndSwap(last, now) {
		ll.suppressed.Add(1)
		return false, 0
	}
	return true, ll.suppressed.Swap(0)
}

func (l *Limiter) ruleIndex(rule *Rule) int {
	for i := range l.cfg.Rules {
		if &l.cfg.Rules[i] == rule {
			return i
		}
	}
	return 0
}

func (l *Limiter) logShadow(rr *RuleResult) {
	if ok, dropped := l.logs[l.ruleIndex(rr.Rule)].allow(); ok {
		l.log.Info("httplimit: shadow rule would deny", "rule", rr.Rule.Name, "key", quoteKey(rr.Key),
			"retry_after", rr.Decision.RetryAfter, "not_logged", dropped)
	}
}

func (l *Limiter) logFailure(rr *RuleResult, err error) {
	if ok, dropped := l.logs[l.ruleIndex(rr.Rule)].allow(); ok {
		l.log.Warn("httplimit: Sluice did not decide; failure policy applied", "rule", rr.Rule.Name,
			"failure", rr.Decision.Failure.String(), "policy", rr.Decision.Policy.String(), "allowed", rr.Decision.Allowed,
			"err", err, "not_logged", dropped)
	}
}

// quoteKey quotes at most 64 bytes of a key for logs.
func quoteKey(key string) string {
	if len(key) > 64 {
		return strconv.Quote(key[:64]) + "..."
	}
	return strconv.Quote(key)
}
