// Package client is the Go client of Sluice: it asks a Sluice node "may
// these hits go through?" over the native gRPC API (sluice.v1) and gives
// back a decision that is always usable, even when Sluice is slow or
// down.
//
// Make one Client per process and share it between goroutines:
//
//	cfg := client.DefaultConfig()
//	cfg.Addr = "127.0.0.1:8081" // any node of the cluster, or every one of them, comma-separated
//	c, err := client.New(cfg)
//	...
//	d, err := c.Check(ctx, client.Check{Key: "user:42", Limit: 100, Window: time.Minute})
//	if err != nil {
//		log.Print(err) // Sluice did not decide; d is the failure policy's answer
//	}
//	if !d.Allowed {
//		// refuse, and tell the caller to come back after d.RetryAfter
//	}
//
// For HTTP servers, package httplimit (below this one) turns rules into
// net/http middleware with the response headers and the 429 done right.
//
// # What a decision guarantees
//
//   - A deadline. Every Check and CheckAll returns within Config.Timeout
//     (20 ms by default, Envoy's default for its rate-limit filter), or the
//     context's deadline if that comes first, whatever Sluice does:
//     queueing, the call and its retry included.
//   - A decision, always. When Sluice does not decide (unreachable, past
//     the deadline, an error), the decision is made by the check's failure
//     policy: FailOpen (the default: a limiter outage must not become an
//     outage of what it protects) or FailClosed (for what must never go
//     over its limit, like a login form). Set it per check
//     (Check.OnFailure), per call (WithPolicy) or per client
//     (Config.OnFailure); the most specific wins. The decision says how it
//     was made (Decision.Source) and, on a failure, which one
//     (Decision.Failure) and which policy answered (Decision.Policy);
//     the error says what went wrong.
//   - One retry on "ownership moving". In a cluster, a key whose owner is
//     changing is refused for a moment (UNAVAILABLE "cluster: ownership
//     moving"). The client sends the call once more after a short pause
//     (2 ms, or a quarter of the time left), within the same deadline,
//     unless the node says some of its hits may be recorded (a batch over
//     several owners that moved after part of it was decided: sent again,
//     those would count twice). Other refusals are not retried: "no
//     quorum" or "still joining" last longer than any deadline worth
//     waiting.
//   - Exactness is Sluice's: the client never allows what Sluice denied,
//     except by the FailOpen policy when Sluice did not decide.
//
// # The local denial cache
//
// A key over its limit stays over it until its retry_after, since denied
// hits are not recorded: knocking on a closed door changes nothing. So the
// client remembers each denial (key, limit, window, algorithm, cost) until
// its retry_after, counted from the moment the call left, which ends no
// later than Sluice's own, and denies the same check, or one that costs
// more, without a call (Decision.Source is SourceCache). A client under
// attack by one key then costs Sluice one call per retry_after for it, not
// one per request. The cache holds at most Config.CacheSize keys.
//
// It only ever denies what Sluice denied, until retry_after. What it
// cannot see: an operator's reset of the key, an override that raises its
// limit, or a refund made by another client, all of which would let the
// key in sooner; the cache goes on denying until retry_after. A refund made
// through this client clears the key's entry. Peeks and penalty checks
// never use the cache.
//
// # Batching
//
// Batches are where Sluice is fastest: one call decides many checks at
// the cost of about one. Check (and CheckEach) coalesces the checks of
// concurrent callers: at most Config.MaxInFlight calls are in flight, and
// the checks made while they are busy leave together in the next call (to
// their node, when the client routes), up to Config.MaxBatch of them. An
// idle client sends each check at once; a busy one sends larger batches.
// Config.BatchWait makes a call wait a little for more checks even when a
// slot is free. Each check of a coalesced call is decided on its own;
// CheckAll sends its checks in a call of their own, all or nothing.
//
// # Checks go to their owners
//
// Any node accepts any check and forwards it to the node that decides its
// key (its owner), which costs the check a second gRPC call inside the
// cluster: two checks in three, in a cluster of three. Given several
// addresses (Config.Addr "sluice-0:8081,sluice-1:8081,sluice-2:8081"),
// or Config.Routing RoutingOn with one (a Kubernetes Service in front of
// the nodes), the client sends each check straight to its owner instead,
// as a token-aware Cassandra driver or a Redis Cluster client does:
//
//   - It asks a node for the routes (RateLimitService.Routes, no
//     credential needed): the members that own keys, whether each is up,
//     and where each serves this API, with the version of that ownership.
//     It connects to each member and keeps a lane per member: the checks
//     of concurrent Check calls bound for one node are coalesced into
//     calls to that node. Config.MaxInFlight bounds the calls in flight
//     over all nodes together.
//   - It finds a key's owner as the nodes do (rendezvous hashing of the
//     member names, package shard): the first member of the key's order
//     that is up. CheckEach splits its checks by owner, queues each part
//     on its node's lane and puts the decisions back in order; CheckAll
//     and Reserve,
//     which must stay in one call, go to the node that owns most of their
//     keys.
//   - Its view goes stale when members join, leave or fail. Every answer
//     carries the version of the ownership the node routed under, and says
//     of each check whether the node had to forward it
//     (Decision.Source SourceForwarded); a newer version, or a forward,
//     makes the client ask for the routes again at once (at most one
//     question per 100 ms, one per second for forwards alone), besides
//     every Config.RoutesRefresh (10 s). A check sent to a member whose
//     connection is not ready goes to the address given; one whose member
//     could not even be dialed is sent there instead (it never left).
//
// A mistake costs a forward, never a wrong decision: the client only picks
// the node a check enters by, and the node that decides is always the
// key's owner, exactly as without routing. Config.Routing RoutingOff (or
// one address and RoutingAuto, the default) sends every check to Addr.
// Stats counts the checks routed and those forwarded anyway.
//
// # Owner or forwarded
//
// A node of a cluster says of each decision whether it forwarded the
// check (SourceForwarded) or decided it itself (SourceOwner); the owner's
// name is in Decision.Node. A single node, or a node of an older release,
// does not: the client then learns the name of the node it calls, once
// per connection (AdminService ListMembers, in the background). Until it
// knows, and always when the node requires an admin token that
// Config.Token is not, decisions say SourceSluice. Config.LearnNode turns
// this off.
//
// # Budgets spent after the fact
//
// Some costs are known only once the work is done (the tokens an LLM
// response used). Two ways to count them:
//
//   - A usage report (Check.Usage): the hits are recorded even when they
//     take the key over its limit, and the checks after it wait until the
//     window has room. Ask before the work with a usage peek (Usage and
//     Peek: allowed while the key is below its limit), report the cost
//     after it.
//   - Reserve and Settle: reserve an estimate before the work (it counts
//     at once, so concurrent work cannot spend the same budget), and
//     settle with the actual cost after it: the difference goes back, an
//     overshoot is recorded. A reservation never settled expires at its
//     estimate. Only the holder of a Reservation can settle it, once.
//
// docs/edge.md, "Token budgets", has the details.
//
// # Quota leases
//
// A hot key (a tenant-wide limit checked by every request) can be spent
// without a call per hit: Client.Lease holds slices of the key's room,
// which Sluice counts as spent at once and the client spends one hit per
// Lease.Allow, settling each with what it used. The key stays exact (a
// slice's hits count until a window after its expiry, and the holder
// stops before it); near the limit, hits go to Sluice one by one. See
// Lease and docs/edge.md, "Quota leases".
//
// # Concurrency and lifecycle
//
// A Client is safe for concurrent use. New does not connect; the first
// call does, and gRPC reconnects as needed. Close cuts the calls in flight
// (their checks fail with ErrClosed and their policy), waits for the
// client's goroutines and closes the connection it dialed.
package client
