package actor

import (
	"fmt"
	"strings"
	"time"
)

// Algorithm selects how a key counts its hits.
type Algorithm uint8

const (
	// SlidingLog keeps the time of every allowed hit (as runs of hits that share
	// a timestamp) and is exact: no interval as long as the window ever holds
	// more than the limit. It is the default.
	SlidingLog Algorithm = iota
	// SlidingWindow is the two-bucket sliding window counter: constant memory,
	// approximate. See docs/engine.md for its error bound.
	SlidingWindow
	// TokenBucket allows bursts up to the limit and refills continuously at
	// limit per window.
	TokenBucket

	numAlgorithms
)

// String returns the algorithm's name as users type it.
func (a Algorithm) String() string {
	switch a {
	case SlidingLog:
		return "sliding_log"
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s ("" means SlidingLog).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "", "sliding_log":
		return SlidingLog, nil
	case "sliding_window":
		return SlidingWindow, nil
	case "token_bucket":
		return TokenBucket, nil
	}
	return 0, fmt.Errorf("actor: unknown algorithm %q (want sliding_log, sliding_window or token_bucket)", s)
}

// Check asks whether Cost hits on Key fit in Limit per Window.
type Check struct {
	// Key names the limited thing: opaque bytes, 1 to Limits.MaxKeyLen long.
	Key string
	// Limit is the number of hits allowed per Window; positive.
	Limit int64
	// Window is the length of the sliding interval, from Limits.MinWindow to
	// Limits.MaxWindow.
	Window time.Duration
	// Algorithm selects the counting method; the zero value is SlidingLog.
	Algorithm Algorithm
	// Cost is the number of hits to record; 0 peeks without recording. It may
	// not exceed Limit.
	Cost int64
	// Refund gives Cost hits back instead of taking them: the newest recorded
	// hits are removed (never below zero). A refund is always allowed.
	Refund bool
	// Penalty records the hits even when the check is denied, so that a client
	// that keeps hitting a closed door extends its own wait.
	Penalty bool
	// Usage marks a report of hits already spent (tokens a response used,
	// known once it is done): they are recorded whether or not they fit,
	// so the key may go above its limit, and checks after it wait until
	// the window has room again. Allowed says whether they fitted; a
	// denied report's RetryAfter is the wait until the key is below its
	// limit again. A cost above the limit is valid. A usage check of cost
	// 0 peeks, and is allowed only while the key is below its limit (a
	// plain peek is allowed at the limit too). docs/engine.md, "Usage and
	// reservations", has each algorithm's rules over the limit.
	Usage bool
	// Reservation, when not nil, makes the check reserve its cost for a
	// while (Reservation.Settle false) or settle a reservation made
	// earlier (true). See Reservation.
	Reservation *Reservation
}

// ReservationID names a reservation: 16 random bytes, which only its
// holder knows. The zero value names none.
type ReservationID [16]byte

// Reservation is the reservation part of a Check.
//
// A reserving check (Settle false) is decided as a plain check of its
// cost, the estimate; if allowed, its hits are recorded at once, so that
// concurrent requests cannot spend the same budget, and the key remembers
// the reservation (its ID, where the hits went, the estimate, and when it
// expires) until it is settled or expires. A reservation that expires is
// settled at its estimate: its hits simply stay. Reserving again with the
// ID of a reservation the key holds records nothing more (a retry).
//
// A settling check (Settle true) settles reservation ID at the check's
// Cost, the actual cost: if it is less than the estimate, the difference
// is given back (the very hits the reservation recorded, if they are
// still in the window); if it is more, the excess is recorded as usage
// (see Check.Usage). The reservation is then forgotten, so a second
// settle of it finds nothing. A settle ignores the check's limit, window
// and algorithm (they are the key's); its Decision is Allowed when the
// reservation was held (and is now settled), and describes the key after
// it, RetryAfter being the wait until the key is below its limit. A
// settle of a reservation the key does not hold (settled already,
// expired, or never made) changes nothing and is not allowed.
type Reservation struct {
	// ID names the reservation. Not zero.
	ID ReservationID
	// TTL is how long a reservation lasts, from Limits.MinWindow to
	// Limits.MaxWindow. Ignored by a settle.
	TTL time.Duration
	// Settle makes the check settle reservation ID instead of making it.
	Settle bool
	// Lease makes the reservation a quota lease: a slice of the key's
	// room that a holder spends on its own, one hit at a time, until the
	// reservation expires, and then settles with what it spent. On a
	// sliding log its hits are recorded at its expiry rather than at
	// now, so that they count in every window that holds any moment the
	// holder may spend them in, and until a window after the expiry: a
	// hit spent at t is counted as if spent at the expiry, never earlier,
	// so no window holds more than the limit, whatever the holder does.
	// (Hits recorded while a lease is open join its run, and count until
	// a window after its expiry too.) A token bucket takes the tokens at
	// once, which its bound allows whenever they are spent. The sliding
	// window, approximate, takes no leases. Leasing again with the ID of
	// an open lease on a sliding log extends it: its hits move to the
	// new expiry, if later; a larger cost grows it, if the hits it adds
	// fit (denied otherwise, unchanged), and a smaller one shrinks it (the
	// rest goes back, as with a settle). Ignored by a settle.
	Lease bool
	// Holder names who holds the reservation (a node, a client, an RLQS
	// stream), for KeyState.Holders; at most MaxHolderLen bytes. It is
	// kept in memory only: a key read from disk, or a standby's copy,
	// knows its reservations without their holders. Ignored by a settle.
	Holder string
	// Demand is, for a new lease with a Holder, the hits a window the
	// holder would spend if nothing limited it: its word for max-min fair
	// shares (see fair.go). When the demands of the key's holders heard
	// from within a window exceed what leases can give out, the lease is
	// granted only up to the part of the holder's fair share it has not
	// leased over the last window. A lease that states a demand is also
	// granted up to the room: Decision.Granted may be less than the cost
	// asked. It is denied when the key has no room (Remaining 0), or when
	// its holder has its whole share while the room is held for others
	// (Remaining above 0; RetryAfter: until its share frees). 0: no demand
	// stated, and the lease is granted whole or not at all, as the room
	// allows.
	Demand int64
}

// MaxHolderLen is the longest Reservation.Holder.
const MaxHolderLen = 128

// MaxReservations is the most reservations one key holds at once. A
// reserving check past it is denied (RetryAfter: until the first of them
// expires): it bounds the memory of a key whatever its callers do.
const MaxReservations = 1024

// settles reports whether c settles a reservation.
func (c *Check) settles() bool { return c.Reservation != nil && c.Reservation.Settle }

// Decision is the answer to one Check.
type Decision struct {
	// Allowed reports whether the cost fitted: used + cost <= limit.
	Allowed bool
	// Limit is the limit the decision was made against.
	Limit int64
	// Remaining is how many cost-1 hits would be allowed right now, after
	// this decision.
	Remaining int64
	// RetryAfter is 0 when allowed; otherwise the shortest wait after which
	// the same check would be allowed if nothing else arrived.
	RetryAfter time.Duration
	// ResetAfter is the time until the whole limit is available again.
	ResetAfter time.Duration
	// Granted is, for an allowed lease, the hits it holds: the cost asked,
	// or less under fair shares (see Reservation.Demand). 0 otherwise.
	Granted int64
	// Share is, for a lease that states a demand (new or extended), its
	// holder's max-min fair share of the key in hits a window while
	// shares are in force; 0 otherwise. A holder that extends its leases
	// (they are never cut for it) lowers itself to it.
	Share int64
	// Err is set when the check could not be decided, and the other fields
	// are zero then (not allowed): a *DamagedError for a key whose stored
	// state is damaged. The other checks of the call were decided.
	Err error
}

// ReservedPrefix starts keys that clients may not use: checks (and
// Inspect, Reset, List's prefix, Import, Forget, Get) on them are refused
// with an *InvalidCheckError ("key: keys starting with two NUL bytes are
// reserved"). The engine keeps its own records under it (ReplicaPrefix), in
// the same store as the keys it decides; no actor ever holds such a key.
const ReservedPrefix = "\x00\x00"

// ReplicaPrefix + key is where a node keeps its copy of key, a key another
// node decides (see Engine.PutReplicas).
const ReplicaPrefix = "\x00\x00r:"

// reservedReason is the InvalidCheckError reason for a reserved key.
const reservedReason = "keys starting with two NUL bytes are reserved"

// Limits bounds what a check may ask for. The zero value of a field means its
// default.
type Limits struct {
	// MaxKeyLen is the longest key in bytes. Default 1024.
	MaxKeyLen int
	// MinWindow is the shortest window. Default 1ms.
	MinWindow time.Duration
	// MaxWindow is the longest window. Default 10 years (3650 days).
	MaxWindow time.Duration
	// MaxBatch is the largest number of checks in one call. Default 1000.
	MaxBatch int
}

// Default values of Limits.
const (
	DefaultMaxKeyLen = 1024
	DefaultMinWindow = time.Millisecond
	DefaultMaxWindow = 3650 * 24 * time.Hour
	DefaultMaxBatch  = 1000
)

func (l Limits) withDefaults() Limits {
	if l.MaxKeyLen <= 0 {
		l.MaxKeyLen = DefaultMaxKeyLen
	}
	if l.MinWindow <= 0 {
		l.MinWindow = DefaultMinWindow
	}
	if l.MaxWindow <= 0 {
		l.MaxWindow = DefaultMaxWindow
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultMaxBatch
	}
	return l
}

// InvalidCheckError reports a check that can never be decided as sent. When a
// call returns it, nothing of that call was recorded.
type InvalidCheckError struct {
	// Index is the position of the check in its batch.
	Index int
	// Field names the offending field: "key", "limit", "window", "cost",
	// "algorithm", "reservation" (or, for List, "prefix").
	Field string
	// Reason says what is wrong and what to change.
	Reason string
}

func (e *InvalidCheckError) Error() string {
	return fmt.Sprintf("actor: check %d: %s: %s", e.Index, e.Field, e.Reason)
}

// validate reports the first thing wrong with c, or nil. l must have its
// defaults applied.
func (c *Check) validate(i int, l Limits) error {
	bad := func(field, format string, args ...any) error {
		return &InvalidCheckError{Index: i, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(c.Key) == 0:
		return bad("key", "empty; every check needs a key")
	case len(c.Key) > l.MaxKeyLen:
		return bad("key", "%d bytes long; the maximum is %d", len(c.Key), l.MaxKeyLen)
	case strings.HasPrefix(c.Key, ReservedPrefix):
		return bad("key", reservedReason)
	case c.Limit <= 0:
		return bad("limit", "%d; it must be a positive count", c.Limit)
	case c.Window < l.MinWindow:
		return bad("window", "%v; it must be at least %v", c.Window, l.MinWindow)
	case c.Window > l.MaxWindow:
		return bad("window", "%v; it must be at most %v", c.Window, l.MaxWindow)
	case c.Algorithm >= numAlgorithms:
		return bad("algorithm", "unknown algorithm %d (want 0 sliding_log, 1 sliding_window or 2 token_bucket)", c.Algorithm)
	case c.Cost < 0:
		return bad("cost", "%d; it must be 0 (peek) or more", c.Cost)
	case c.Cost > c.Limit && !c.Refund && !c.Usage && !c.settles():
		return bad("cost", "%d is above the limit %d, so it could never be allowed; split it or raise the limit", c.Cost, c.Limit)
	}
	if r := c.Reservation; r != nil {
		switch {
		case c.Refund || c.Penalty || c.Usage:
			return bad("reservation", "a check that reserves or settles cannot also be a refund, a penalty or a usage report")
		case r.ID == ReservationID{}:
			return bad("reservation", "the reservation ID is zero")
		case r.Settle:
		case c.Cost == 0:
			return bad("cost", "0: a reservation needs an estimate of at least 1")
		case r.TTL < l.MinWindow || r.TTL > l.MaxWindow:
			return bad("reservation", "lasts %v; it must last from %v to %v", r.TTL, l.MinWindow, l.MaxWindow)
		case r.Lease && c.Algorithm == SlidingWindow:
			return bad("algorithm", "sliding_window takes no leases: its count is an estimate, so a slice of it is not exact; use sliding_log or token_bucket")
		case len(r.Holder) > MaxHolderLen:
			return bad("holder", "%d bytes long; at most %d", len(r.Holder), MaxHolderLen)
		case r.Demand < 0:
			return bad("demand", "%d: a lease's demand is the hits a window its holder wants, 0 or more", r.Demand)
		case r.Demand > 0 && (!r.Lease || r.Holder == ""):
			return bad("demand", "only a lease with a holder states a demand: it is that holder's word for fair shares")
		}
	}
	return nil
}

// validKey returns an *InvalidCheckError (of check index i) if key cannot
// be a client's key: empty, too long, or reserved. l must have its defaults
// applied.
func validKey(i int, key string, l Limits) error {
	switch {
	case key == "" || len(key) > l.MaxKeyLen:
		return &InvalidCheckError{Index: i, Field: "key", Reason: fmt.Sprintf("%d bytes long; want 1 to %d", len(key), l.MaxKeyLen)}
	case strings.HasPrefix(key, ReservedPrefix):
		return &InvalidCheckError{Index: i, Field: "key", Reason: reservedReason}
	}
	return nil
}

// maxQuotedKey is how much of a key error messages and logs quote.
const maxQuotedKey = 64

// QuoteKey quotes key for a message or a log line: at most its first 64
// bytes, and its length when it is longer, so that a huge key never turns
// into a huge message.
func QuoteKey[K string | []byte](key K) string {
	if len(key) <= maxQuotedKey {
		return fmt.Sprintf("%q", string(key))
	}
	return fmt.Sprintf("%q… (%d bytes)", string(key[:maxQuotedKey]), len(key))
}
