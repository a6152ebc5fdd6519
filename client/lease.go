package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of LeaseConfig.
const (
	// DefaultLeaseTTLFraction: a slice lasts a tenth of the key's window
	// unless LeaseConfig.TTL says otherwise, from MinLeaseTTL to
	// MaxLeaseTTL. The hits of a slice count until a window after its
	// expiry (see Lease), so a short slice costs the key less room.
	DefaultLeaseTTLFraction = 10
	// MinLeaseTTL and MaxLeaseTTL bound the default TTL of a slice.
	MinLeaseTTL = 10 * time.Millisecond
	MaxLeaseTTL = 5 * time.Second
	// DefaultLeaseSliceFraction: a slice asks for a tenth of the limit
	// unless LeaseConfig.Slice says otherwise, at least 1.
	DefaultLeaseSliceFraction = 10
)

// leaseClockMargin is the part of a slice's TTL a holder spends: it stops
// at send + TTL × 10/11, so that a holder whose clock runs up to 10% slow
// against the owner's (ρ, as for the nodes' leases) still stops before
// the owner's expiry.
const leaseClockMargin = 11

// LeaseConfig configures a Lease.
type LeaseConfig struct {
	// Slice is how many hits each slice asks for. 0: a tenth of the
	// limit, at least 1. After the first window a slice asks for no more
	// than a TTL of the holder's demand. Sluice grants a slice up to the
	// key's room and the holder's fair share (see Lease): all of it, or
	// part.
	Slice int64
	// TTL is how long a slice lasts. 0: a tenth of the window, from
	// MinLeaseTTL to MaxLeaseTTL. Sluice bounds it by the window's range.
	TTL time.Duration
	// Holder names this holder among the key's holders (sluice key get,
	// and fair shares: see Lease), at most 128 bytes. Default: the host's
	// name and the process ID, "web-7f9c/4121", and "#2", "#3"... for the
	// process's later Leases.
	Holder string
}

// Lease holds quota leases on one hot key: slices of its room that Sluice
// counts as spent and that the holder spends on its own, one hit per
// Allow, without a call. A spent or expired slice is settled with what
// was used (the rest goes back to the key) and the next one taken. Each
// slice request states the holder's demand (the hits Allow was asked for
// over about the last window), and Sluice grants it up to the key's room
// and the holder's max-min fair share among the key's holders. When
// Sluice grants none (no room, or the holder has its share while others
// want the rest), Allow denies, and goes on denying without a call until
// Sluice's RetryAfter, at most a TTL. When Sluice does not answer, the
// failure policy decides that hit, and for a TTL each hit is asked for as
// Check does.
//
// The key never allows more than its limit in any window, whatever the
// holders do, crash included: on a sliding log, a slice's hits are
// recorded at its expiry (so they count in every window the holder may
// spend them in, and for a window after it), and the holder spends
// nothing once TTL × 10/11 has passed since it asked, by its own clock.
// The price is room: a slice's hits, and the key's other hits while a
// slice is open, count until a window after the slice's expiry, and a
// slice's unspent hits are held until it is settled. Keep the TTL short
// against the window. A token bucket takes a slice's tokens at once. A
// sliding window takes no leases: Lease refuses one, and a key an
// override makes one answers the slice request INVALID_ARGUMENT. A slice
// request Sluice refuses (that, or no credential for leases: see
// Config.Token) is counted in LeaseStats.Refused, and the hits are asked
// for as plain checks, each TTL trying a slice again.
//
// A Lease is safe for concurrent use. Close settles the open slice.
type Lease struct {
	c      *Client
	check  Check
	slice  int64
	ttl    time.Duration
	holder string

	mu       sync.Mutex
	cur      *slice
	renewing chan struct{} // closed when the slice being asked for arrives
	retryAt  time.Time     // no slice is asked for before it
	closed   bool
	settling sync.WaitGroup
	// The hits Allow was asked for, in the period of a window from at and
	// in the one before, since born: the demand the holder states.
	born, at         time.Time
	asked, askedPrev int64
	// deniedUntil: Sluice said there is no room for this holder (the
	// key at its limit, or the holder at its fair share); hits are
	// denied here until then.
	deniedUntil time.Time
	deniedWhy   Decision

	local, direct, slices, denied, refused, givenBack, deniedHere atomic.Uint64
}

// slice is a granted lease.
type slice struct {
	r       *Reservation
	n, used int64
	until   time.Time // the holder spends nothing from then on
}

// maxHolderLen is the longest LeaseConfig.Holder a node takes.
const maxHolderLen = 128

// leasesMade numbers the process's Leases, for defaultHolder.
var leasesMade atomic.Int64

// defaultHolder is the default LeaseConfig.Holder: host/pid, and #n for
// the process's nth Lease from the second on, so that two Leases of one
// key are two holders to Sluice's fair shares.
func defaultHolder() string {
	host, _ := os.Hostname()
	h := fmt.Sprintf("%s/%d", host, os.Getpid())
	if n := leasesMade.Add(1); n > 1 {
		h += fmt.Sprintf("#%d", n)
	}
	return h[max(0, len(h)-maxHolderLen):]
}

// Lease returns a holder of quota leases on ch's key (ch.Cost, Peek,
// Refund and Usage are ignored: each Allow spends one hit). The key
// needs its limit and window in ch; an unset algorithm takes the
// server's.
func (c *Client) Lease(ch Check, cfg LeaseConfig) (*Lease, error) {
	switch {
	case ch.Key == "":
		return nil, errors.New("client: lease: the key is empty")
	case ch.Limit <= 0 || ch.Window <= 0:
		return nil, fmt.Errorf("client: lease %s: a lease needs the key's limit and window (got %d per %v)", quoteKey(ch.Key), ch.Limit, ch.Window)
	case ch.Algorithm == SlidingWindow:
		return nil, fmt.Errorf("client: lease %s: sliding_window takes no leases (its count is an estimate); use sliding_log or token_bucket", quoteKey(ch.Key))
	case cfg.Slice < 0 || cfg.TTL < 0:
		return nil, fmt.Errorf("client: lease %s: slice %d and TTL %v must not be negative", quoteKey(ch.Key), cfg.Slice, cfg.TTL)
	case len(cfg.Holder) > maxHolderLen:
		return nil, fmt.Errorf("client: lease %s: holder %q is %d bytes long; at most %d", quoteKey(ch.Key), cfg.Holder[:32]+"...", len(cfg.Holder), maxHolderLen)
	}
	now := time.Now()
	l := &Lease{c: c, check: ch, slice: cfg.Slice, ttl: cfg.TTL, holder: cfg.Holder, born: now, at: now}
	if l.holder == "" {
		l.holder = defaultHolder()
	}
	l.check.Cost, l.check.Peek, l.check.Refund, l.check.Usage, l.check.Penalty = 1, false, false, false, false
	if l.slice == 0 {
		l.slice = max(1, ch.Limit/DefaultLeaseSliceFraction)
	}
	if l.ttl == 0 {
		l.ttl = min(max(ch.Window/DefaultLeaseTTLFraction, MinLeaseTTL), MaxLeaseTTL)
	}
	return l, nil
}

// Allow spends one hit of the key: from the slice held when there is one
// (Decision.Source SourceLease, no call), else from a new slice, else by
// asking Sluice as Check does. Its error is Check's, or the one of the
// call that asked for a slice.
func (l *Lease) Allow(ctx context.Context, opts ...Option) (Decision, error) {
	counted := false
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return l.c.failed(&l.check, PolicyDefault, ErrClosed), fmt.Errorf("client: lease %s: %w", quoteKey(l.check.Key), ErrClosed)
		}
		now := time.Now()
		if !counted {
			l.ask(now)
			counted = true
		}
		if s := l.cur; s != nil {
			if s.used < s.n && now.Before(s.until) {
				s.used++
				left := s.n - s.used
				l.mu.Unlock()
				l.local.Add(1)
				return Decision{Allowed: true, Limit: l.check.Limit, Remaining: left, Source: SourceLease, lease: s}, nil
			}
			l.cur = nil
			l.settle(s)
		}
		if now.Before(l.deniedUntil) {
			d := l.deniedWhy
			d.RetryAfter = l.deniedUntil.Sub(now)
			l.mu.Unlock()
			l.deniedHere.Add(1)
			return d, nil
		}
		if now.Before(l.retryAt) {
			l.mu.Unlock()
			return l.directly(ctx, opts)
		}
		if w := l.renewing; w != nil {
			l.mu.Unlock()
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return l.c.failed(&l.check, PolicyDefault, ctx.Err()), fmt.Errorf("client: lease %s: %w", quoteKey(l.check.Key), ctx.Err())
			}
		}
		want := l.slice
		demand := l.demand(now)
		if now.Sub(l.born) >= l.check.Window {
			// Sized by demand once a window of it is known: a slice no
			// larger than a TTL of it, so that little is held unspent.
			want = max(1, min(want, demand*int64(l.ttl)/int64(l.check.Window)+1))
		}
		w := make(chan struct{})
		l.renewing = w
		l.mu.Unlock()

		s, d, err := l.take(ctx, want, demand, opts)

		l.mu.Lock()
		l.renewing = nil
		close(w)
		switch {
		case s != nil && l.closed:
			l.settle(s)
			l.mu.Unlock()
			return l.c.failed(&l.check, PolicyDefault, ErrClosed), fmt.Errorf("client: lease %s: %w", quoteKey(l.check.Key), ErrClosed)
		case s != nil && time.Now().Before(s.until):
			l.cur = s
			l.mu.Unlock()
			continue
		case s != nil:
			// It came back too late to spend: calls take longer than
			// the TTL allows, so ask for each hit for a while.
			l.settle(s)
		}
		if err == nil && s == nil && d.Known() {
			// No room for this holder: the key is at its limit
			// (Remaining 0), or the holder has its fair share and the
			// room left is held for the key's other holders. Its hits
			// are denied here, without a call, until Sluice's
			// RetryAfter, at most a TTL; then a slice is asked for again.
			// (Asking for each hit instead would take the room as it
			// frees, first come first served, past any fair share.)
			wait := min(max(d.RetryAfter, time.Millisecond), l.ttl)
			l.deniedUntil = time.Now().Add(wait)
			l.deniedWhy = Decision{Limit: d.Limit, Remaining: 0, Node: d.Node, Source: SourceLease}
			l.mu.Unlock()
			d.Allowed, d.Remaining, d.RetryAfter, d.Source = false, 0, wait, SourceLease
			return d, nil
		}
		l.retryAt = time.Now().Add(l.ttl)
		l.mu.Unlock()
		if err != nil && d.Failure == FailureRejected {
			// The slice itself was refused (no credential for leases, a
			// key whose override makes it a sliding window): the hit is
			// asked for as a plain check.
			l.refused.Add(1)
			return l.directly(ctx, opts)
		}
		if err != nil {
			// Sluice did not decide: the failure policy decides this hit.
			return d, err
		}
		return l.directly(ctx, opts)
	}
}

// GiveBack returns the hit of d, a decision of l's Allow, to the slice it
// was spent from, if l still holds that slice: the hit is then as if never
// spent. It is for a request that another check denied after this one
// allowed it. It reports whether it gave the hit back; a hit decided by
// Sluice, or spent from a slice already settled, stays spent (counted,
// never over the limit).
func (l *Lease) GiveBack(d Decision) bool {
	if d.lease == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.cur; s != d.lease || s.used == 0 {
		return false
	}
	d.lease.used--
	l.local.Add(^uint64(0))
	l.givenBack.Add(1)
	return true
}

// ask counts a hit Allow was asked for at now. l.mu is held.
func (l *Lease) ask(now time.Time) {
	l.advance(now)
	l.asked++
}

// advance moves the demand's periods on to the one that holds now.
func (l *Lease) advance(now time.Time) {
	w := l.check.Window
	if el := now.Sub(l.at); el >= w {
		if el < 2*w {
			l.askedPrev = l.asked
		} else {
			l.askedPrev = 0
		}
		l.asked = 0
		l.at = l.at.Add(el - el%w)
	}
}

// demand returns the hits a window this holder wants, as it tells Sluice
// for fair shares: those Allow was asked for over about the last window
// (over the first window, its rate so far), and a quarter more, for the
// slices that expire partly spent.
func (l *Lease) demand(now time.Time) int64 {
	l.advance(now)
	w := float64(l.check.Window)
	var est float64
	if age := now.Sub(l.born); age < l.check.Window {
		est = float64(l.asked) * w / float64(max(age, l.ttl))
	} else {
		est = float64(l.asked) + float64(l.askedPrev)*(1-float64(now.Sub(l.at))/w)
	}
	return max(1, int64(min(est*5/4, float64(math.MaxInt64/2)))+1)
}

// take asks Sluice for a slice of want hits, stating demand. It returns
// the slice if granted (all of want, or the part Sluice granted), and
// the decision.
func (l *Lease) take(ctx context.Context, want, demand int64, opts []Option) (*slice, Decision, error) {
	ch := l.check
	ch.Cost = want
	sent := time.Now()
	r, err := l.c.reserve(ctx, l.ttl, []Check{ch}, true, l.holder, demand, opts)
	d := r.Decisions[0]
	if err != nil || !r.Held() {
		if err == nil {
			l.denied.Add(1)
		}
		return nil, d, err
	}
	l.slices.Add(1)
	if g := d.granted; g > 0 && g < want {
		want = g
	}
	return &slice{r: r, n: want, until: sent.Add(l.ttl * (leaseClockMargin - 1) / leaseClockMargin)}, d, nil
}

// directly asks Sluice for one hit.
func (l *Lease) directly(ctx context.Context, opts []Option) (Decision, error) {
	l.direct.Add(1)
	return l.c.Check(ctx, l.check, opts...)
}

// settle settles s in the background, at what was used, unless it was
// spent whole (nothing would go back). l.mu is held.
func (l *Lease) settle(s *slice) {
	if s.used == s.n {
		return
	}
	l.settling.Add(1)
	go func() {
		defer l.settling.Done()
		l.c.Settle(context.Background(), s.r, s.used) //nolint:errcheck // a slice not settled expires at its estimate
	}()
}

// Close settles the open slice and waits, within ctx, for the settles
// under way. Allow fails with ErrClosed afterwards. The Client stays
// open.
func (l *Lease) Close(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		if s := l.cur; s != nil {
			l.cur = nil
			l.settle(s)
		}
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.settling.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("client: lease %s: settling: %w", quoteKey(l.check.Key), ctx.Err())
	}
}

// LeaseStats counts what a Lease did.
type LeaseStats struct {
	// Local is the hits allowed from a slice, without a call.
	Local uint64
	// Direct is the hits asked of Sluice one by one, while no slice was
	// held.
	Direct uint64
	// Slices is the slices granted; Denied those Sluice did not grant
	// (no room); Refused the slice requests it refused (no credential
	// for leases, a key an override makes a sliding window): their hits
	// were asked for as plain checks.
	Slices, Denied, Refused uint64
	// GivenBack is the hits given back to their slice (GiveBack), no
	// longer counted in Local.
	GivenBack uint64
	// DeniedHere is the hits denied without a call, after Sluice denied
	// a slice: the key had no room, or this holder had its fair share
	// while others wanted the rest (see Lease).
	DeniedHere uint64
}

// Stats returns what l did so far.
func (l *Lease) Stats() LeaseStats {
	return LeaseStats{Local: l.local.Load(), Direct: l.direct.Load(), Slices: l.slices.Load(), Denied: l.denied.Load(), Refused: l.refused.Load(), GivenBack: l.givenBack.Load(), DeniedHere: l.deniedHere.Load()}
}
