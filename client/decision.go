package client

import (
	"fmt"
	"time"
)

// Check asks whether Cost hits on Key fit in Limit hits per Window. It is
// the Go form of the native API's sluice.v1.Check (docs/engine.md has the
// semantics).
type Check struct {
	// Key is the limited thing, for example "tenant:42:GET /search":
	// opaque bytes, 1 to 1024 bytes long by default (a server setting).
	// Required.
	Key string
	// Limit is the number of hits allowed per Window; positive. 0 asks the
	// server for the limit of an override or its limits file.
	Limit int64
	// Window is the length of the sliding interval the limit applies to,
	// from 1ms to 3650 days by default. 0 asks the server for the window of
	// an override or its limits file.
	Window time.Duration
	// Algorithm is how the key counts; the zero value lets the server
	// choose (an override's, the limits file's, else SlidingLog).
	Algorithm Algorithm
	// Cost is the number of hits to record. 0 means 1; use Peek to record
	// nothing. A cost above the limit can never be allowed: the server
	// refuses it (INVALID_ARGUMENT), and the failure policy applies.
	Cost int64
	// Peek asks without recording anything (cost 0 on the wire). A peek
	// is never answered from the local denial cache.
	Peek bool
	// Refund gives Cost hits back instead of taking them (the newest
	// recorded hits go first). It needs the refund or admin token when the
	// node has one (Config.Token). A refund removes the key from the local
	// denial cache.
	Refund bool
	// Penalty records the hits even when the check is denied. A penalty
	// check is never answered from the local denial cache, which would
	// not record them.
	Penalty bool
	// Usage reports hits already spent (the tokens a response used, known
	// once it is done): they are recorded even when they do not fit, so
	// the key may go above its limit and later checks wait until the
	// window has room; Allowed says whether they fitted, and a cost above
	// the limit is valid. With Peek, the check asks whether the key is
	// below its limit (a plain peek is allowed at the limit too): the
	// question to ask before work whose cost is reported after it. A
	// usage check is never answered from the local denial cache; a usage
	// report (not a peek) cannot be part of CheckAll.
	Usage bool
	// OnFailure is what this check's decision is when Sluice does not
	// decide it. The zero value takes the call's policy (WithPolicy), else
	// Config.OnFailure.
	OnFailure Policy
}

// cost is the cost sent on the wire.
func (c *Check) cost() int64 {
	switch {
	case c.Peek:
		return 0
	case c.Cost == 0:
		return 1
	}
	return c.Cost
}

// Algorithm selects how a key counts its hits.
type Algorithm int32

// The algorithms (docs/engine.md describes them and their error bounds).
const (
	// AlgorithmDefault lets the server choose: the algorithm of an
	// override or the limits file, else SlidingLog.
	AlgorithmDefault Algorithm = iota
	// SlidingLog is exact: no interval as long as the window ever holds
	// more than the limit.
	SlidingLog
	// SlidingWindow is the two-bucket approximation, constant memory per
	// key, for very high limits.
	SlidingWindow
	// TokenBucket allows bursts of up to the limit, refilled continuously
	// at limit/window.
	TokenBucket
)

func (a Algorithm) String() string {
	switch a {
	case AlgorithmDefault:
		return "default"
	case SlidingLog:
		return "sliding_log"
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	}
	return fmt.Sprintf("Algorithm(%d)", int32(a))
}

// Policy says what a check's decision is when Sluice does not decide it:
// it cannot be reached, it does not answer within the deadline, or it
// answers with an error.
type Policy uint8

const (
	// PolicyDefault takes the policy of the call, else of the Client
	// (Config.OnFailure, FailOpen unless set).
	PolicyDefault Policy = iota
	// FailOpen allows the request: a limiter outage does not become an
	// outage of what it protects. The right choice for most traffic.
	FailOpen
	// FailClosed denies the request: for what must never go over its limit
	// (a login form, an expensive or abusable endpoint), at the price of
	// refusing it while Sluice is away.
	FailClosed
)

func (p Policy) String() string {
	switch p {
	case PolicyDefault:
		return "default"
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy parses "open" or "closed" (as String writes them).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return PolicyDefault, fmt.Errorf("client: failure policy %q: want open or closed", s)
}

// Source says how a decision was made.
type Source uint8

const (
	// SourceOwner: the node the client called owns the key and decided it.
	SourceOwner Source = iota + 1
	// SourceForwarded: the node the client called forwarded the check to
	// the key's owner (Decision.Node), which decided it.
	SourceForwarded
	// SourceSluice: Sluice decided it (the owner is Decision.Node), and
	// the client does not know the name of the node it called, so it
	// cannot tell owner from forwarded. See Client.Node.
	SourceSluice
	// SourceCache: the local denial cache denied it without a call, since
	// Sluice denied the same check less than its retry_after ago.
	SourceCache
	// SourceFailure: Sluice did not decide it; Decision.Failure says why
	// and Decision.Policy which policy made the decision.
	SourceFailure
	// SourceLease: a Lease allowed it from the slice it holds, without a
	// call; Remaining is what is left of the slice (the key may have
	// more room).
	SourceLease
)

func (s Source) String() string {
	switch s {
	case SourceOwner:
		return "owner"
	case SourceForwarded:
		return "forwarded"
	case SourceSluice:
		return "sluice"
	case SourceCache:
		return "cache"
	case SourceFailure:
		return "failure"
	case SourceLease:
		return "lease"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Failure says why Sluice did not decide a check.
type Failure uint8

const (
	// FailureNone: Sluice decided (or the cache did).
	FailureNone Failure = iota
	// FailureUnreachable: no connection to the node (refused, reset, no
	// route, TLS failure).
	FailureUnreachable
	// FailureTimeout: no answer within the deadline (Config.Timeout, or the
	// context's deadline if earlier). The hits may or may not have been
	// recorded.
	FailureTimeout
	// FailureUnavailable: the node answered UNAVAILABLE: it may not decide
	// the key now (no quorum, still joining, ownership moving after the
	// retry, owner down) or it is shutting down.
	FailureUnavailable
	// FailureOverloaded: the node answered RESOURCE_EXHAUSTED (a queue is
	// full).
	FailureOverloaded
	// FailureRejected: the node refused the call for what it asked
	// (INVALID_ARGUMENT: a bad key, limit, window or cost;
	// UNAUTHENTICATED: a refund without the token) or failed
	// (INTERNAL, UNIMPLEMENTED). A bug to fix rather than an outage.
	FailureRejected
	// FailureCanceled: the caller's context was canceled.
	FailureCanceled
	// FailureClosed: the Client was closed.
	FailureClosed
	// FailureDamaged: the node answered DATA_LOSS for this check: the
	// key's stored state is damaged (the other checks of the call were
	// decided). An operator clears it with sluice key reset.
	FailureDamaged
)

func (f Failure) String() string {
	switch f {
	case FailureNone:
		return "none"
	case FailureUnreachable:
		return "unreachable"
	case FailureTimeout:
		return "timeout"
	case FailureUnavailable:
		return "unavailable"
	case FailureOverloaded:
		return "overloaded"
	case FailureRejected:
		return "rejected"
	case FailureCanceled:
		return "canceled"
	case FailureClosed:
		return "closed"
	case FailureDamaged:
		return "damaged"
	}
	return fmt.Sprintf("Failure(%d)", uint8(f))
}

// Decision is the answer to one Check. Durations are measured from the
// moment the owner decided (for SourceCache, from now).
type Decision struct {
	// Allowed says whether the hits were let through (and recorded, unless
	// the check peeked). For SourceFailure it is the policy's answer.
	Allowed bool
	// Limit is the limit the check was decided against, after overrides
	// and the limits file. 0 when Sluice did not decide.
	Limit int64
	// Remaining is how many cost-1 hits would be allowed now, after this
	// decision. -1 when unknown: Sluice did not decide, or the check was
	// part of a CheckAll that the cache denied for another of its checks.
	Remaining int64
	// RetryAfter is 0 when allowed; otherwise the shortest wait after which
	// the same check would be allowed if nothing else arrived. 0 when
	// Sluice did not decide.
	RetryAfter time.Duration
	// ResetAfter is the time until the whole limit is available again, if
	// nothing else arrives. 0 when unknown.
	ResetAfter time.Duration
	// Node names the node that owns the key and decided it (for
	// SourceCache, the one that made the cached denial). Empty for
	// SourceFailure.
	Node string
	// Source says how the decision was made.
	Source Source
	// Failure says why Sluice did not decide; FailureNone unless Source is
	// SourceFailure.
	Failure Failure
	// Policy is the failure policy that made a SourceFailure decision
	// (FailOpen or FailClosed); PolicyDefault otherwise.
	Policy Policy

	// lease is the slice a SourceLease decision spent its hit from (see
	// Lease.GiveBack).
	lease *slice
	// granted is, for a lease, the hits Sluice granted.
	granted int64
}

// Known reports whether the decision carries Sluice's counts (Limit,
// Remaining, RetryAfter, ResetAfter): true unless Sluice did not decide.
func (d *Decision) Known() bool { return d.Source != SourceFailure && d.Remaining >= 0 }
