package client_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestLeaseLedger is the claim of quota leases, tried where it breaks: two
// holders, each spent by two goroutines as fast as they can, and a caller
// checking the key directly, for a few windows on one node. Every allowed
// hit is in a ledger with the moments its decision certainly lies
// between; no window may certainly hold more than the limit. A lease
// whose hits the node dated at the grant rather than at the expiry fails
// it (hits spent at a slice's end outlive their count).
func TestLeaseLedger(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	const limit, window = 200, time.Second
	hot := client.Check{Key: "lease|hot", Limit: limit, Window: window}
	var (
		mu     sync.Mutex
		ledger []ledgerHit
	)
	record := func(from time.Time, d client.Decision) {
		if d.Allowed {
			mu.Lock()
			ledger = append(ledger, ledgerHit{from, time.Now()})
			mu.Unlock()
		}
	}
	var leases []*client.Lease
	for range 2 {
		l, err := c.Lease(hot, client.LeaseConfig{Slice: 20, TTL: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	ctx := context.Background()
	end := time.Now().Add(3 * window)
	var wg sync.WaitGroup
	for i := range 4 {
		l := leases[i%2]
		wg.Go(func() {
			for time.Now().Before(end) {
				from := time.Now()
				d, err := l.Allow(ctx)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				record(from, d)
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(end) {
			from := time.Now()
			d, err := c.Check(ctx, hot)
			if err != nil {
				t.Errorf("Check: %v", err)
				return
			}
			record(from, d)
		}
	})
	wg.Wait()
	for _, l := range leases {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	peak := certainPeak(ledger, window)
	var st client.LeaseStats
	for _, l := range leases {
		s := l.Stats()
		st.Local, st.Direct, st.Slices, st.Denied = st.Local+s.Local, st.Direct+s.Direct, st.Slices+s.Slices, st.Denied+s.Denied
	}
	t.Logf("%d hits allowed in %v, at most %d certainly within one window (limit %d); leases: %+v", len(ledger), 3*window, peak, limit, st)
	if peak > limit {
		t.Fatalf("%d hits certainly within one window; want at most the limit %d", peak, limit)
	}
	if st.Local == 0 || st.Slices == 0 {
		t.Fatalf("leases %+v: want hits allowed from slices", st)
	}
	if len(ledger) < limit {
		t.Fatalf("%d hits allowed in three windows of a limit of %d: the holders starved", len(ledger), limit)
	}
}

// ledgerHit is an allowed hit: sent at from, answered at to.
type ledgerHit struct{ from, to time.Time }

// certainPeak sorts ledger and returns the most hits certainly within one
// window: those sent after the first's start and answered before a window
// after it.
func certainPeak(ledger []ledgerHit, window time.Duration) int {
	slices.SortFunc(ledger, func(a, b ledgerHit) int { return a.from.Compare(b.from) })
	peak := 0
	for i := range ledger {
		in := 0
		for j := i; j < len(ledger) && ledger[j].from.Before(ledger[i].from.Add(window)); j++ {
			if ledger[j].to.Before(ledger[i].from.Add(window)) {
				in++
			}
		}
		peak = max(peak, in)
	}
	return peak
}

// TestLeaseNearTheLimit: a slice larger than the key's room is granted
// the room; with none left, the slice is denied, and so are the hits
// after it, without a call, for Sluice's RetryAfter (at most a TTL).
// Close gives back what a slice did not spend.
func TestLeaseNearTheLimit(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	ctx := context.Background()
	key := client.Check{Key: "lease|near", Limit: 10, Window: time.Hour}
	peek := client.Check{Key: key.Key, Limit: 10, Window: time.Hour, Peek: true}
	for range 7 {
		if d, err := c.Check(ctx, key); err != nil || !d.Allowed {
			t.Fatalf("Check = %+v, %v", d, err)
		}
	}
	l, err := c.Lease(key, client.LeaseConfig{Slice: 5, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.Allow(ctx)
	if err != nil || !d.Allowed || d.Source != client.SourceLease || d.Remaining != 2 {
		t.Fatalf("Allow with 3 left and slices of 5 = %+v, %v; want allowed from a slice of the 3 left (part of the 5 asked), 2 left of it", d, err)
	}
	if d, err := c.Check(ctx, peek); err != nil || d.Remaining != 0 {
		t.Fatalf("peek = %+v, %v; want nothing left: the slice holds the 3", d, err)
	}
	for range 2 {
		if d, err := l.Allow(ctx); err != nil || d.Source != client.SourceLease {
			t.Fatalf("Allow = %+v, %v; want a hit of the slice", d, err)
		}
	}
	d, err = l.Allow(ctx)
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("Allow with the slice spent and no room = %+v, %v; want denied, with a wait", d, err)
	}
	if d, err := l.Allow(ctx); err != nil || d.Allowed {
		t.Fatalf("Allow again = %+v, %v; want denied here", d, err)
	}
	if st := l.Stats(); st.Slices != 1 || st.Denied != 1 || st.Direct != 0 || st.Local != 3 || st.DeniedHere != 1 {
		t.Fatalf("stats %+v; want one slice of 3 spent, one denied, the next hit denied without a call", st)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx); err == nil {
		t.Fatal("Allow after Close succeeded")
	}

	// A slice partly spent gives the rest back on Close.
	key.Key, peek.Key = "lease|giveback", "lease|giveback"
	l, err = c.Lease(key, client.LeaseConfig{Slice: 5, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx); err != nil || d.Source != client.SourceLease || d.Remaining != 4 {
		t.Fatalf("Allow = %+v, %v; want allowed from a slice of 5, 4 left of it", d, err)
	}
	if d, err := c.Check(ctx, peek); err != nil || d.Remaining != 5 {
		t.Fatalf("peek with a slice of 5 open = %+v, %v; want 5 left", d, err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Check(ctx, peek); err != nil || d.Remaining != 9 {
		t.Fatalf("peek after Close = %+v, %v; want 9 left (the slice settled at the 1 it spent)", d, err)
	}
}

// TestLeaseGiveBack: a hit given back to the slice it came from is spent
// again without a call; one whose slice was settled since, or one Sluice
// decided, is not given back (it was counted).
func TestLeaseGiveBack(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	ctx := context.Background()
	key := client.Check{Key: "lease|back", Limit: 4, Window: time.Hour}
	l, err := c.Lease(key, client.LeaseConfig{Slice: 2, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := l.Allow(ctx)
	d2, _ := l.Allow(ctx)
	if !l.GiveBack(d2) || l.GiveBack(client.Decision{Allowed: true, Source: client.SourceSluice}) {
		t.Fatal("GiveBack of a hit of the slice held refused, or of a decision of Sluice accepted")
	}
	d3, err := l.Allow(ctx)
	if err != nil || d3.Source != client.SourceLease || d3.Remaining != 0 {
		t.Fatalf("Allow after a hit given back = %+v, %v; want it spent from the same slice, none left", d3, err)
	}
	if d, err := l.Allow(ctx); err != nil || d.Source != client.SourceLease { // the first slice is settled: a second one
		t.Fatalf("Allow = %+v, %v; want a second slice", d, err)
	}
	if l.GiveBack(d1) {
		t.Fatal("GiveBack of a hit of a settled slice accepted: the settle counted it")
	}
	if st := l.Stats(); st.GivenBack != 1 || st.Local != 3 || st.Slices != 2 {
		t.Fatalf("stats %+v; want 1 given back, 3 local, 2 slices", st)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Check(ctx, client.Check{Key: key.Key, Limit: 4, Window: time.Hour, Peek: true}); err != nil || d.Remaining != 1 {
		t.Fatalf("peek after Close = %+v, %v; want 1 left (3 hits spent)", d, err)
	}
}

// TestLeaseRefusedWithoutToken: a node with a refund token refuses the
// slices of a client without it; the hits go to the node as plain
// checks, none to the failure policy. With the token, slices.
func TestLeaseRefusedWithoutToken(t *testing.T) {
	n := nodetest.Start(t, "n1", func(c *node.Config) { c.RefundToken = "r3fund" })
	for _, token := range []string{"", "r3fund"} {
		c := newClient(t, n.Addr, func(cfg *client.Config) { cfg.Token = token })
		l, err := c.Lease(client.Check{Key: "lease|token" + token, Limit: 10, Window: time.Hour}, client.LeaseConfig{Slice: 5, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if d, err := l.Allow(context.Background()); err != nil || !d.Allowed || d.Source == client.SourceFailure {
				t.Fatalf("token %q: Allow = %+v, %v; want allowed by Sluice or a slice", token, d, err)
			}
		}
		st := l.Stats()
		if token == "" && (st.Refused != 1 || st.Direct != 3 || st.Slices != 0) || token != "" && (st.Slices != 1 || st.Local != 3) {
			t.Errorf("token %q: stats %+v; want one slice refused and 3 plain checks without it, one slice spent 3 times with it", token, st)
		}
		l.Close(context.Background())
	}
}

// TestLeaseRefusesSlidingWindow: a holder on a sliding window is refused
// at once, with a message that names the algorithms that lease.
func TestLeaseRefusesSlidingWindow(t *testing.T) {
	c, err := client.New(client.Config{Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Lease(client.Check{Key: "k", Limit: 10, Window: time.Second, Algorithm: client.SlidingWindow}, client.LeaseConfig{}); err == nil {
		t.Fatal("a lease on a sliding window was accepted")
	}
}

// TestLeaseForwarded: a slice asked of a node that does not own the key
// is forwarded as a lease, so the owner dates its hits at the expiry (its
// reset comes a window after the slice's end, not a window after now).
func TestLeaseForwarded(t *testing.T) {
	t.Parallel() // on a cluster of its own, waiting more than computing
	tc := nodetest.StartCluster(t, 3, nil)
	ctx := context.Background()
	key := client.Check{Key: "lease|forwarded", Limit: 100, Window: time.Minute}
	var via *nodetest.Node
	var name string
	for i, n := range tc.Nodes {
		if name = fmt.Sprintf("node-%d", i); name != owner(tc, key.Key) {
			via = n
			break
		}
	}
	c := newClient(t, via.Addr, func(cfg *client.Config) { cfg.Routing = client.RoutingOff })
	l, err := c.Lease(key, client.LeaseConfig{Slice: 10, TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx); err != nil || d.Source != client.SourceLease {
		t.Fatalf("Allow = %+v, %v; want allowed from a slice", d, err)
	}
	d, err := c.Check(ctx, client.Check{Key: key.Key, Limit: 100, Window: time.Minute, Peek: true})
	if err != nil || d.Source != client.SourceForwarded || d.Remaining != 90 || d.ResetAfter <= 80*time.Second {
		t.Fatalf("peek through %s = %+v, %v; want forwarded, 90 left, reset after about 90 s (the slice's 30 s and a window)", name, d, err)
	}
	l.Close(ctx)
}

// TestLeaseFairShare: two holders of one key, one asking thousands of
// times a second from two goroutines and one 100 times a second. Each states its demand, so
// Sluice divides the key by max-min fair share: the modest holder gets
// about all it asks for, the greedy one the rest (denied at home, without
// a call, once it has its share), and no window certainly holds more
// than the limit.
func TestLeaseFairShare(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	const limit, window = 300, time.Second
	hot := client.Check{Key: "lease|fair", Limit: limit, Window: window}
	ttl := 100 * time.Millisecond
	greedy, err := c.Lease(hot, client.LeaseConfig{Slice: 30, TTL: ttl, Holder: "greedy"})
	if err != nil {
		t.Fatal(err)
	}
	modest, err := c.Lease(hot, client.LeaseConfig{Slice: 30, TTL: ttl, Holder: "modest"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu             sync.Mutex
		ledger         []ledgerHit
		asked, allowed int // the modest holder's, in the last two windows
	)
	ctx := context.Background()
	start := time.Now()
	end := start.Add(4 * window)
	spend := func(l *client.Lease) bool {
		from := time.Now()
		d, err := l.Allow(ctx)
		if err != nil {
			t.Errorf("Allow: %v", err)
			return false
		}
		if d.Allowed {
			mu.Lock()
			ledger = append(ledger, ledgerHit{from, time.Now()})
			mu.Unlock()
		}
		return d.Allowed
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(end) {
				if !spend(greedy) {
					time.Sleep(time.Millisecond) // not a poll: the greedy holder's pace when denied
				} else {
					time.Sleep(100 * time.Microsecond) // not a poll: its pace, thousands a second, at a bounded cost to the machine
				}
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for now := range tick.C {
			if !now.Before(end) {
				return
			}
			ok := spend(modest)
			if now.After(start.Add(2 * window)) {
				asked++
				if ok {
					allowed++
				}
			}
		}
	})
	wg.Wait()
	for _, l := range []*client.Lease{greedy, modest} {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	peak := certainPeak(ledger, window)
	gs, ms := greedy.Stats(), modest.Stats()
	t.Logf("modest holder: %d of %d allowed in the last two windows; peak window %d (limit %d); greedy %+v; modest %+v", allowed, asked, peak, limit, gs, ms)
	if peak > limit {
		t.Fatalf("%d hits certainly within one window; want at most the limit %d", peak, limit)
	}
	if asked < 50 || allowed < asked*8/10 {
		t.Fatalf("the modest holder had %d of its %d hits allowed; want at least 80%%: its demand is below its fair share", allowed, asked)
	}
	if gs.DeniedHere == 0 {
		t.Fatalf("greedy %+v: want hits denied at home over its share", gs)
	}
}
