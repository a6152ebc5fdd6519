// Package httplimit is net/http middleware that limits requests with
// Sluice: rules name what to count requests by (a key) and how many to
// allow per window; a request goes through only if every rule that
// applies to it allows it.
//
//	c, _ := client.New(cfg) // package client: deadline, failure policy, cache
//	l, err := httplimit.New(httplimit.Config{
//		Client: c,
//		Rules: []httplimit.Rule{
//			{Name: "per_key", Key: httplimit.Header("X-API-Key"), Limit: 100, Window: time.Minute},
//			{Name: "per_ip", Key: httplimit.ClientIP(), Limit: 300, Window: time.Minute},
//		},
//	})
//	...
//	http.ListenAndServe(addr, l.Wrap(mux))
//
// Wrap is the func(http.Handler) http.Handler that routers take
// (net/http's ServeMux per route, chi's Use, ...). A Limiter per route
// gives each route its own rules.
//
// Give the client every node of a cluster (client.Config.Addr
// "sluice-0:8081,sluice-1:8081,sluice-2:8081") and it sends each
// request's check straight to the node that decides its key; a request
// under several rules is decided all or nothing, in one call to the node
// that owns most of its keys (see package client, "Checks go to their
// owners").
//
// # Keys
//
// Header (an API key), Account (the authenticated account an earlier
// middleware put in the context), ClientIP, Route, Path, Method, Query,
// Form (a field of a form or JSON body, such as a submitted username),
// Const (one global counter), and Join of several. A request for which a
// rule's key has no value is not counted by that rule, so a rule on an
// optional header needs a companion that always applies (ClientIP).
// Each rule counts under its own Sluice keys, Config.KeyPrefix + rule name
// + "|" + value: two rules never share a counter. Values longer than 128
// bytes are replaced by their SHA-256.
//
// The client IP is the connection's peer. X-Forwarded-For and Forwarded
// are read only when that peer is one of Config.TrustedProxies (none by
// default), and then from the right, stopping at the first address that
// is not a trusted proxy: a header trusted from anyone lets every request
// present a new identity. IPv6 clients are counted per /64.
//
// # Several rules: the login case
//
// The enforced rules that apply to a request are decided in one call,
// all or nothing: a request that one rule denies spends nothing of the
// others. A login form limited per client IP and per submitted username
// (Form("username")) then covers both attacks, many passwords on one
// account from many addresses and many accounts from one address, and a
// user locked out by the username rule does not use up the IP's
// allowance of their neighbours behind the same NAT.
//
// # Responses
//
// Every response carries the RateLimit-Policy and RateLimit header fields
// of the IETF draft (draft-ietf-httpapi-ratelimit-headers, 09 and later),
// allowed or not, one list member per enforced rule:
//
//	RateLimit-Policy: "per_key";q=100;w=60, "per_ip";q=300;w=60
//	RateLimit: "per_key";r=41;t=37, "per_ip";r=280;t=12
//
// q is the limit, w the window in seconds (rounded up), r the requests
// remaining, t the seconds until the limit is whole again, or, for a rule
// that denied, until a retry can succeed. RateLimit lists only the rules
// Sluice decided (none when it was down).
//
// A denied request gets 429 Too Many Requests with Retry-After set to the
// retry_after of the rule that denied it, rounded up to whole seconds,
// plus Config.RetryAfterHeadroom (2 s) and a random jitter of 0 to
// Config.RetryAfterJitter (3 s), so that clients denied together do not
// come back together and do not arrive a moment too early;
// Cache-Control: no-store; and a short RFC 9457 problem details body
// (application/problem+json) that says the request was limited and when
// to retry, and nothing about the rule or its numbers.
//
// # Failures
//
// When Sluice does not decide (package client: past its deadline, down,
// an error), each rule's OnFailure decides: FailOpen lets the request
// through, FailClosed denies it (429 as above). Choose per rule: fail
// open for ordinary traffic, closed for a login form. Failures are logged
// at most once a second per rule, with the count of the others.
//
// # Shadow rules
//
// A rule with Shadow set is decided alongside the enforced ones, in calls
// of its own, so that its would-be denials never block a request nor
// spend the enforced rules' hits. They are logged (at most once a second
// per rule) and reported to Config.Observe, but never shown in headers.
//
// # Costs known after the response
//
// A rule with a ResponseCost (a response header or trailer) is a budget
// spent after the fact, such as LLM tokens: a request goes through while
// the budget is below its limit, and once the handler returned, Wrap (and
// ServeNext, or Report for callers of Decide) records the cost the
// response carried, even over the limit. Config.ObserveUsage sees each.
//
// # Hot keys: leases
//
// A rule with Lease set (a service-wide limit every request checks) is
// decided from quota leases this process holds (client.Lease), without a
// call per request, and exactly: Sluice counts each slice as spent. Such
// rules are decided first; a request another rule denies gives its hit
// back to the slice. Call Limiter.Close when the server stops, to settle
// the open slices.
package httplimit
