// Package api adapts gRPC to the engine: Sluice's native API
// (sluice.v1.RateLimitService), Envoy's Rate Limit Service v3, and the
// admin API (sluice.v1.AdminService). Checks go to a Decider (the node's
// cluster.Router, which decides on this node's engine or forwards to the
// key's member); admin calls read the engine and ask the node's place in
// the cluster through the interfaces Cluster and AdminPeers. The package
// names no concrete router or membership.
//
// It turns requests into engine checks (limits from the request, an
// override or the limits file, in that order of precedence; Envoy
// descriptors into keys), decisions into responses (Envoy's statuses and
// headers included), and errors into gRPC statuses in exactly one place,
// toStatus (status.go), which shares the mapping of engine and cluster
// errors with the peer protocol (cluster.Status). Bad input fails the whole
// call with INVALID_ARGUMENT before anything is recorded.
//
// Admin calls are answered as if there were one node: a key's state comes
// from its owner, listings cover every node (cluster.AdminPeers reaches
// them), overrides are set on every node (package api/overrides keeps
// them, in the data file's meta bucket "overrides", and copies them).
//
// The operator's view (TrafficService, and the web UI through Traffic):
// each node counts the checks its decision APIs decide, and the requests
// with their latency, in an api/traffic Recorder (striped, so that
// decisions do not wait for each other, and bounded); GetTraffic asks
// every live member for its figures and merges their top lists (api/topk),
// whose error bounds survive the merge.
//
// Two HTTP handlers serve envoyproxy/ratelimit's /json (a decision over
// HTTP, through the same path as ShouldRateLimit) and /rlconfig (the
// limits in force); the node mounts them on its HTTP listener.
//
// The package wires nothing: the node (cmd/sluice/node) opens the store,
// starts the engine, joins the cluster and serves these services with
// Register and Interceptors (which require the admin token on admin and
// peer calls when one is set).
package api
