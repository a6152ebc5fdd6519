// Package node is the composition root of a Sluice node: it opens the data
// file (persist), starts the engine (actor), reads the limits file, joins
// the cluster (cluster: gossip membership, the router, handoff and
// standbys; cluster/control: the cluster map in Raft, epochs and leases,
// on the peer listener), builds the gRPC services (api) and serves them
// with grpc health, reflection and the HTTP endpoints (/metrics, /healthz,
// /readyz, the operator's web pages under /ui/ (package ui),
// /debug/pprof/), and stops all of it in order. It is the only place that wires these packages
// together: `sluice serve` builds a Config from its flags and runs a Node,
// and the end-to-end tests start the same Node in-process on 127.0.0.1:0.
//
// # Lifecycle
//
// New refuses a Config that Validate refuses, fills in its defaults
// (WithDefaults), and allocates in named steps: it opens storage, builds
// the router and the engine (which need each other: see newEngine), the
// services and the listeners' handlers; nothing listens yet. Start listens
// first (a bind error returns at once), serves in the background, and in a
// cluster joins gossip, starts the control plane and attaches both to the
// router (cluster.Router.Join), which then runs; the node
// reports ready (grpc health SERVING, /readyz 200) once it may decide (see
// cluster.Router.Ready). Shutdown reports not ready; in a cluster it
// leaves its keys complete elsewhere (its standbys up to date, or, with one
// replica, every key handed over) and ends its epoch, staying a member of
// the cluster map (if the copies are not complete in time, it ends its
// epoch anyway and its keys wait for it); then it stops gRPC gracefully
// under ShutdownTimeout, flushes and closes the data file. It is
// idempotent.
//
// # Listeners
//
// The gRPC services share GRPCAddr unless the peer or admin service has a
// listener of its own (PeerAddr, AdminAddr): each gRPC listener has a
// server of its own, built with the same options, and Start, Shutdown and
// Crash act on all of them. Every listener, HTTP included, holds at most
// MaxConnections connections (limitListener: the next one waits in the
// kernel's accept queue); each gRPC connection at most MaxConcurrentStreams
// calls, answered or not, and it is dropped when it goes silent
// (KeepaliveTime, KeepaliveTimeout) or idle (MaxConnectionIdle).
//
// # Metrics
//
// The node registers on its own Prometheus registry (Registry): the
// decision metrics of the APIs (api), the engine's, the store's and the
// cluster's (this package, as their observers), the Go runtime's and the
// process's, and sluice_build_info (Config.Build). Every labelled series
// with a known set of label values exists from the start, at zero, so
// that increase() sees its first event. /metrics speaks OpenMetrics to a
// scraper that asks for it.
//
// # Health
//
// grpc health answers for the server ("") and for each service a probe may
// name (see healthServices), all following NotReady.
package node
