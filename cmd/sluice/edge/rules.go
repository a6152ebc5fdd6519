package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
)

// RulesFile is the content of a rules file: routes, each with the rules
// its requests go through. docs/edge.md is its reference.
//
//	routes:
//	  - name: login
//	    path_prefix: /login
//	    methods: [POST]
//	    on_error: closed
//	    rules:
//	      - {name: login_ip, key: ip, limit: 20, window: 1h}
//	      - {name: login_user, key: "form:username", limit: 5, window: 15m}
//	  - name: api
//	    path_prefix: /
//	    rules:
//	      - {name: per_key, key: "header:X-API-Key", limit: 100, window: 1m}
type RulesFile struct {
	// Routes are matched by the longest path prefix, then by method, in
	// file order among equals. A request that matches none is proxied
	// without a limit.
	Routes []RouteSpec `yaml:"routes"`
}

// RouteSpec is one route of a rules file.
type RouteSpec struct {
	// Name names the route in metrics and logs; unique. Required.
	Name string `yaml:"name"`
	// PathPrefix is the start of the paths the route takes, in normal form
	// (httplimit.CleanPath: no "//", no dot segments, no needless
	// percent-encoding). Default "/". Requests match on their path in that
	// form, which the origin receives too.
	PathPrefix string `yaml:"path_prefix"`
	// PathCaseInsensitive matches PathPrefix whatever the case of the
	// request's path (for an origin that folds case, such as IIS): then
	// "/LOGIN" takes a route of "/login". Paths are case-sensitive by
	// default, as for nginx and most origins, which serve "/LOGIN" as
	// another resource.
	PathCaseInsensitive bool `yaml:"path_case_insensitive"`
	// Methods are the methods the route takes; empty takes every method.
	Methods []string `yaml:"methods"`
	// OnError is the failure policy of the route's rules that set none:
	// "open" (the default) or "closed".
	OnError string `yaml:"on_error"`
	// Rules are the route's rules; a route without rules proxies its
	// requests unlimited (an exemption from a shorter prefix's rules).
	Rules []RuleSpec `yaml:"rules"`
}

// RuleSpec is one rule of a route.
type RuleSpec struct {
	// Name names the rule in the Sluice keys it counts under, in the
	// RateLimit-Policy header, in metrics and logs; unique in the file.
	// Letters, digits, '_', '-' and '.'. Required.
	Name string `yaml:"name"`
	// Key is what requests are counted by (see ParseKey). Required.
	Key string `yaml:"key"`
	// Secret hashes the key's values before they are sent to Sluice or
	// logged (httplimit.Secret), for a credential whose name does not say
	// so; a header, query parameter or form field named like a credential
	// ("X-API-Key", "Authorization", "token") is hashed without it.
	Secret bool `yaml:"secret"`
	// Limit is the number of requests allowed per window; positive.
	Limit int64 `yaml:"limit"`
	// Window is the sliding window: a Go duration ("90s", "15m", "1h") or
	// whole days ("7d"). Required.
	Window string `yaml:"window"`
	// Algorithm is sliding_log (the default: exact), sliding_window or
	// token_bucket.
	Algorithm string `yaml:"algorithm"`
	// Cost is what one request costs; default 1. With response_cost it
	// must be left out.
	Cost int64 `yaml:"cost"`
	// ResponseCost makes the rule a budget spent after the fact (LLM
	// tokens): "response-header:NAME" or "response-trailer:NAME", a whole
	// number the origin's response carries. A request goes through while
	// the budget is below its limit; the cost its response reports is
	// recorded once the response is done, even over the limit.
	ResponseCost string `yaml:"response_cost"`
	// OnError is the rule's failure policy, "open" or "closed"; default the
	// route's.
	OnError string `yaml:"on_error"`
	// Shadow counts and logs the requests the rule would deny, without
	// denying them.
	Shadow bool `yaml:"shadow"`
	// Lease, if set, decides the rule from quota leases the edge holds on
	// each of its keys (httplimit.Rule.Lease): for a key every request
	// checks, such as a service-wide limit.
	Lease *LeaseSpec `yaml:"lease"`
}

// LeaseSpec sizes a rule's quota lease slices; `lease: {}` takes the
// defaults.
type LeaseSpec struct {
	// Slice is how many requests a slice holds; default a tenth of the
	// limit.
	Slice int64 `yaml:"slice"`
	// TTL is how long a slice lasts, a Go duration; default a tenth of
	// the window, from 10ms to 5s.
	TTL string `yaml:"ttl"`
}

// ParseRules parses and checks a rules file, reporting every problem at
// once, each with its route and rule.
func ParseRules(data []byte) (*RulesFile, error) {
	var f RulesFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("edge: rules: the file is empty; give at least one route")
		}
		return nil, fmt.Errorf("edge: rules: %w", err)
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate reports every problem of f at once.
func (f *RulesFile) Validate() error {
	var errs []error
	if len(f.Routes) == 0 {
		errs = append(errs, errors.New("edge: rules: no routes"))
	}
	routes := map[string]bool{}
	rules := map[string]string{}
	for i := range f.Routes {
		rt := &f.Routes[i]
		where := fmt.Sprintf("edge: rules: route %d (%q)", i, rt.Name)
		if rt.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is empty", where))
		} else if routes[rt.Name] {
			errs = append(errs, fmt.Errorf("%s: name is used twice", where))
		}
		routes[rt.Name] = true
		if rt.PathPrefix != "" && !strings.HasPrefix(rt.PathPrefix, "/") {
			errs = append(errs, fmt.Errorf("%s: path_prefix %q: want a path starting with /", where, rt.PathPrefix))
		} else if clean, err := httplimit.CleanPath(rt.PathPrefix); rt.PathPrefix != "" && (err != nil || clean != rt.PathPrefix) {
			errs = append(errs, fmt.Errorf("%s: path_prefix %q: want it in normal form (%q), as requests are matched in it", where, rt.PathPrefix, clean))
		}
		for _, m := range rt.Methods {
			if !isToken(m) {
				errs = append(errs, fmt.Errorf("%s: method %q", where, m))
			}
		}
		if _, err := parsePolicy(rt.OnError); err != nil {
			errs = append(errs, fmt.Errorf("%s: on_error: %v", where, err))
		}
		for j := range rt.Rules {
			ru := &rt.Rules[j]
			where := fmt.Sprintf("%s, rule %d (%q)", where, j, ru.Name)
			if prev, ok := rules[ru.Name]; ok && ru.Name != "" {
				errs = append(errs, fmt.Errorf("%s: name is used by route %q too: rule names are counters, give each its own", where, prev))
			}
			rules[ru.Name] = rt.Name
			if _, err := ru.rule(rt.Name, client.PolicyDefault); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", where, err))
			}
		}
	}
	return errors.Join(errs...)
}

// isToken reports whether s is an HTTP method token.
func isToken(s string) bool {
	for _, c := range s {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, c) {
			return false
		}
	}
	return s != ""
}

// rule compiles a rule spec of route.
func (s *RuleSpec) rule(route string, routePolicy client.Policy) (httplimit.Rule, error) {
	var errs []string
	r := httplimit.Rule{Name: s.Name, Limit: s.Limit, Cost: s.Cost, Shadow: s.Shadow}
	var err error
	if s.ResponseCost != "" {
		if r.ResponseCost, err = httplimit.ParseResponseCost(s.ResponseCost); err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), "httplimit: "))
		}
	}
	if r.Key, err = ParseKey(s.Key, route); err != nil {
		errs = append(errs, err.Error())
	} else if s.Secret {
		r.Key = httplimit.Secret(r.Key)
	}
	if s.Window == "" {
		errs = append(errs, "window is missing")
	} else if r.Window, err = parseDuration(s.Window); err != nil {
		errs = append(errs, "window: "+err.Error())
	}
	if r.Algorithm, err = parseAlgorithm(s.Algorithm); err != nil {
		errs = append(errs, err.Error())
	}
	if r.OnFailure, err = parsePolicy(s.OnError); err != nil {
		errs = append(errs, "on_error: "+err.Error())
	}
	if r.OnFailure == client.PolicyDefault {
		r.OnFailure = routePolicy
	}
	if s.Lease != nil {
		r.Lease = &client.LeaseConfig{Slice: s.Lease.Slice}
		if s.Lease.TTL != "" {
			if r.Lease.TTL, err = time.ParseDuration(s.Lease.TTL); err != nil || r.Lease.TTL <= 0 {
				errs = append(errs, fmt.Sprintf("lease ttl %q: want a positive Go duration such as 100ms", s.Lease.TTL))
			}
		}
	}
	if len(errs) == 0 {
		if err := r.Validate(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return r, errors.New(strings.Join(errs, "; "))
	}
	return r, nil
}

// ParseKey parses a key spec: one of
//
//	ip              the client IP (trusted proxies' headers: --trusted-proxies)
//	header:NAME     a request header, such as header:X-API-Key
//	form:FIELD      a field of a form or JSON body, such as form:username
//	query:NAME      a URL query parameter
//	method          the request method
//	path            the request path
//	route           the route: one counter for the whole route
//
// or several joined by '+' (ip+header:User-Agent), counted together.
func ParseKey(spec, route string) (httplimit.Key, error) {
	if spec == "" {
		return httplimit.Key{}, errors.New("key is missing: want ip, header:NAME, form:FIELD, query:NAME, method, path or route, or several joined by +")
	}
	var keys []httplimit.Key
	for _, part := range strings.Split(spec, "+") {
		kind, arg, hasArg := strings.Cut(part, ":")
		var k httplimit.Key
		switch {
		case kind == "ip" && !hasArg:
			k = httplimit.ClientIP()
		case kind == "method" && !hasArg:
			k = httplimit.Method()
		case kind == "path" && !hasArg:
			k = httplimit.Path()
		case kind == "route" && !hasArg:
			k = httplimit.Const(route)
		case kind == "header" && arg != "":
			k = httplimit.Header(arg)
		case kind == "form" && arg != "":
			k = httplimit.Form(arg)
		case kind == "query" && arg != "":
			k = httplimit.Query(arg)
		default:
			return httplimit.Key{}, fmt.Errorf("key %q: part %q: want ip, header:NAME, form:FIELD, query:NAME, method, path or route", spec, part)
		}
		keys = append(keys, k)
	}
	if len(keys) == 1 {
		return keys[0], nil
	}
	return httplimit.Join(keys...), nil
}

func parsePolicy(s string) (client.Policy, error) {
	if s == "" {
		return client.PolicyDefault, nil
	}
	return client.ParsePolicy(s)
}

func parseAlgorithm(s string) (client.Algorithm, error) {
	switch s {
	case "":
		return client.AlgorithmDefault, nil
	case "sliding_log":
		return client.SlidingLog, nil
	case "sliding_window":
		return client.SlidingWindow, nil
	case "token_bucket":
		return client.TokenBucket, nil
	}
	return 0, fmt.Errorf("algorithm %q: want sliding_log, sliding_window or token_bucket", s)
}

// parseDuration parses a Go duration, or whole days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err == nil && n > 0 && n <= 3650 {
			return time.Duration(n) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want for example 90s, 15m, 1h or 7d", s)
	}
	return d, nil
}

// route is a compiled route.
type route struct {
	name    string
	prefix  string
	fold    bool     // match prefix whatever the case
	methods []string // nil: any
	limiter *httplimit.Limiter
	metrics *routeMetrics
}

// table is a compiled rules file: its routes, longest prefix first.
type table struct {
	routes []*route
}

// close settles the slices the table's limiters hold (leased rules), when
// the table is replaced or the edge stops.
func (t *table) close(ctx context.Context) error {
	var errs []error
	for _, rt := range t.routes {
		errs = append(errs, rt.limiter.Close(ctx))
	}
	return errors.Join(errs...)
}

// match returns the route of r, nil if none.
func (t *table) match(r *http.Request) *route {
	for _, rt := range t.routes {
		if rt.fold && !hasPrefixFold(r.URL.Path, rt.prefix) || !rt.fold && !strings.HasPrefix(r.URL.Path, rt.prefix) {
			continue
		}
		if rt.methods == nil {
			return rt
		}
		for _, m := range rt.methods {
			if m == r.Method {
				return rt
			}
		}
	}
	return nil
}

// build compiles f with the limiters' shared configuration (everything but
// the rules, and Observe, set per route).
func build(f *RulesFile, base httplimit.Config, m *metrics) (*table, error) {
	t := &table{}
	for i := range f.Routes {
		spec := &f.Routes[i]
		policy, err := parsePolicy(spec.OnError)
		if err != nil {
			return nil, err
		}
		rt := &route{name: spec.Name, prefix: spec.PathPrefix, fold: spec.PathCaseInsensitive}
		if rt.prefix == "" {
			rt.prefix = "/"
		}
		for _, meth := range spec.Methods {
			rt.methods = append(rt.methods, strings.ToUpper(meth))
		}
		cfg := base
		cfg.Rules = nil
		for j := range spec.Rules {
			r, err := spec.Rules[j].rule(spec.Name, policy)
			if err != nil {
				return nil, fmt.Errorf("edge: rules: route %q, rule %q: %w", spec.Name, spec.Rules[j].Name, err)
			}
			cfg.Rules = append(cfg.Rules, r)
		}
		rt.metrics = m.route(spec.Name, cfg.Rules)
		cfg.Observe = rt.metrics.observe
		cfg.ObserveUsage = rt.metrics.observeUsage
		if rt.limiter, err = httplimit.New(cfg); err != nil {
			return nil, fmt.Errorf("edge: rules: route %q: %w", spec.Name, err)
		}
		t.routes = append(t.routes, rt)
	}
	sort.SliceStable(t.routes, func(i, j int) bool { return len(t.routes[i].prefix) > len(t.routes[j].prefix) })
	return t, nil
}

// hasPrefixFold is strings.HasPrefix under Unicode case folding.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
