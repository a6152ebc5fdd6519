// Command sluice is the single Sluice binary: it runs a node and talks to
// one.
//
//	sluice serve                     run a node
//	sluice check KEY                 ask for one decision
//	sluice key get|list|reset|envoy  look at and reset live key state
//	sluice override set|list|rm      change a key's limit without a deploy
//	sluice members                   list the cluster's members (epochs, Raft roles, share of keys); forget one
//	sluice top                       watch the busiest and most denied keys and each node's rates
//	sluice bench                     load a node and report decisions/s and latency
//	sluice edge                      a rate-limiting reverse proxy in front of an origin
//	sluice version                   print the version, commit and Go version
//
// # Environment
//
// Every flag of serve and edge, and every connection flag of the client commands
// (--addr, --admin-token, --timeout, --tls*, --insecure, --output), also
// reads the environment variable SLUICE_<FLAG>: upper case, dashes turned
// into underscores (--data-dir reads SLUICE_DATA_DIR). A flag given on the
// command line wins; an empty variable counts as unset; a value that does
// not parse is an error that names the variable. The flags that shape one
// request (--limit, --window, --prefix, ...) read no variable, so that a
// stray SLUICE_PREFIX in an operator's shell can never widen an override
// or a deletion.
//
// # Exit codes
//
//	0    success; for check, the hits were allowed
//	1    any error: bad flags or environment, cannot connect, the server
//	     refused the call, the node could not start or stop cleanly
//	2    check only: the decision was "denied" (the output is printed
//	     as usual)
//	128+N  serve got a second SIGINT (130) or SIGTERM (143) and exited
//	     without finishing its graceful shutdown
//
// # Failures
//
// The client commands retry a call that fails with UNAVAILABLE, up to four
// attempts within about 350 ms (a gRPC retry policy on the sluice.v1
// services; refunds are not retried). A call that still fails is reported
// from its status code and details, not its text: the node asked could not
// be reached (and then a probe of --addr tells a closed port from the HTTP
// port or a TLS mismatch), or it answered UNAVAILABLE, naming the owner it
// could not reach when that is the reason (errdetails.ErrorInfo, see
// cluster.ErrorDomain). A check that gets no limit or window names the flag
// to give (errdetails.BadRequest).
//
// # Serving
//
// serve logs its effective configuration (the values in force, defaults
// resolved; the tokens redacted) and
// serves until SIGINT or SIGTERM, then shuts down gracefully within
// --shutdown-timeout, flushes the data file and exits 0. A second signal
// exits at once. With --ready-file, serve writes the addresses it is bound
// to, as JSON, once it serves (and removes the file when it stops), so that
// scripts and tests can use port 0:
//
//	{"grpc_addr":"127.0.0.1:40123","http_addr":"127.0.0.1:40124","pid":4242}
//
// # Keys
//
// Keys are bytes. The client commands print them in a printable form:
// printable ASCII as is, a backslash as \\, any other byte as \xNN; the
// same form EnvoyKey returns. A KEY argument is taken literally, or, with
// --escaped, in that printable form. With --envoy DOMAIN, the arguments
// are an Envoy descriptor's entries (key=value ...) and the command acts on
// the key Sluice counts that descriptor under.
package main
