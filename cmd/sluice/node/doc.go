// Package node is the composition root of a Sluice node: it opens the data
// file (persist), starts the engine (actor), reads the limits file, joins
// the cluster (cluster: membership, leases, router, handoff), builds the
// gRPC services (api) and serves them with grpc health, reflection and the
// HTTP endpoints (/metrics, /healthz, /readyz, the operator's web pages
// under /ui/ (package ui), /debug/pprof/), and stops
// all of it in order. It is the only place that wires these packages
// together: `sluice serve` builds a Config from its flags and runs a Node,
// and the end-to-end tests start the same Node in-process on 127.0.0.1:0.
//
// # Lifecycle
//
// New allocates and opens storage; nothing listens yet. Start listens
// first (a bind error returns at once), serves in the background, and in a
// cluster joins it and starts the router; the node reports ready (grpc
// health SERVING, /readyz 200) once it may decide (see cluster.Router.Ready).
// Shutdown reports not ready, hands every key over and leaves the cluster
// (or, if it cannot, stops without leaving so that its keys wait for it),
// stops gRPC gracefully under ShutdownTimeout, flushes and closes the data
// file. It is idempotent.
//
// # Metrics
//
// The node registers on its own Prometheus registry (Registry): the
// decision metrics of the APIs (api), and the engine's, the store's and
// the cluster's (this package, as their observers).
package node
