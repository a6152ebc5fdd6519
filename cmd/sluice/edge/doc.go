// Package edge is `sluice edge`: a rate-limiting reverse proxy in front of
// an origin, built from package client (the decision: deadline, failure
// policy, denial cache, batching) and package httplimit (the rules, the
// client IP, the headers and the 429). The command builds a Config from
// its flags and runs an Edge; the tests start the same Edge in-process on
// 127.0.0.1:0 in front of a real origin and a real Sluice node.
//
// Each request is matched to a route of the rules (the longest path
// prefix, then the method); its rules decide it in one call to Sluice
// (all or nothing when there are several); an allowed request is
// forwarded to the origin (httputil.ReverseProxy, X-Forwarded-For
// appended), a denied one gets the 429 of httplimit. A request that
// matches no route, or to which no rule applies, is forwarded unlimited.
//
// The rules come from a YAML file (RulesFile, reloaded when it changes; a
// change that does not load is refused and the rules in force stay) or,
// for one rule, from flags. docs/edge.md is the reference.
//
// # Lifecycle
//
// New builds the client, the proxy and the rules (the first load of the
// rules file must succeed). Start listens on both addresses first, then
// serves in the background and polls the rules file. Shutdown turns
// /healthz to 503, stops accepting, lets requests in flight finish within
// ShutdownTimeout, and closes the client; it is idempotent.
//
// # Metrics
//
// On MetricsAddr, apart from the proxied paths, with /healthz:
// sluice_edge_requests_total{route,result}, sluice_edge_decisions_total
// {route,rule,result,source}, sluice_edge_failures_total
// {route,rule,failure,policy}, sluice_edge_decision_duration_seconds
// {route} (the latency the edge adds), sluice_edge_rules_reloads_total
// {result}, sluice_edge_origin_errors_total, and the client's counters:
// sluice_edge_sluice_calls_total, sluice_edge_sluice_checks_total,
// sluice_edge_sluice_retries_total, sluice_edge_cache_denials_total,
// sluice_edge_cache_keys.
package edge
