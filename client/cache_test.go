package client

import (
	"fmt"
	"testing"
	"time"
)

// fakeNow is a clock the tests move by hand.
type fakeNow struct{ t time.Time }

func (f *fakeNow) now() time.Time      { return f.t }
func (f *fakeNow) add(d time.Duration) { f.t = f.t.Add(d) }
func newFakeNow() *fakeNow             { return &fakeNow{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }
func denied(retry, reset time.Duration) *Decision {
	return &Decision{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: retry, ResetAfter: reset, Node: "n1", Source: SourceOwner}
}

// TestCacheAnswersOnlyTheDeniedCheck: a cached denial answers the same
// check, or one that costs more, until its retry_after counted from when
// the call left, and nothing else.
func TestCacheAnswersOnlyTheDeniedCheck(t *testing.T) {
	clk := newFakeNow()
	base := Check{Key: "k", Limit: 3, Window: time.Minute}
	sent := clk.now()
	clk.add(time.Millisecond) // the answer came 1 ms after the call left
	c := newDenialCache(100, clk.now)
	c.store(&base, denied(10*time.Second, 30*time.Second), sent)

	tests := []struct {
		name  string
		edit  func(*Check)
		after time.Duration
		want  bool
	}{
		{"same check", func(*Check) {}, 0, true},
		{"same check just before retry_after", func(*Check) {}, 10*time.Second - 2*time.Millisecond, true},
		{"same check at retry_after", func(*Check) {}, 10*time.Second - time.Millisecond, false},
		{"higher cost", func(c *Check) { c.Cost = 2 }, 0, true},
		{"cost 1 written out", func(c *Check) { c.Cost = 1 }, 0, true},
		{"other key", func(c *Check) { c.Key = "other" }, 0, false},
		{"other limit", func(c *Check) { c.Limit = 4 }, 0, false},
		{"other window", func(c *Check) { c.Window = time.Hour }, 0, false},
		{"other algorithm", func(c *Check) { c.Algorithm = TokenBucket }, 0, false},
		{"peek", func(c *Check) { c.Peek = true }, 0, false},
		{"penalty", func(c *Check) { c.Penalty = true }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newDenialCache(100, clk.now)
			c.store(&base, denied(10*time.Second, 30*time.Second), sent)
			saved := clk.t
			defer func() { clk.t = saved }()
			clk.add(tt.after)
			ch := base
			tt.edit(&ch)
			d, ok := c.lookup(&ch)
			if ok != tt.want {
				t.Fatalf("lookup(%+v) after %v = %v; want %v", ch, tt.after, ok, tt.want)
			}
			if !ok {
				return
			}
			wantRetry := sent.Add(10 * time.Second).Sub(clk.now())
			if d.Allowed || d.Source != SourceCache || d.RetryAfter != wantRetry || d.Remaining != 0 || d.Limit != 3 || d.Node != "n1" {
				t.Errorf("lookup(%+v) = %+v; want a cache denial with RetryAfter %v", ch, d, wantRetry)
			}
			if wantReset := sent.Add(30 * time.Second).Sub(clk.now()); d.ResetAfter != wantReset {
				t.Errorf("ResetAfter = %v; want %v", d.ResetAfter, wantReset)
			}
		})
	}

	// A cost-2 denial does not answer a cost-1 check, which may fit.
	c2 := newDenialCache(100, clk.now)
	two := base
	two.Cost = 2
	c2.store(&two, denied(time.Second, time.Second), sent)
	if _, ok := c2.lookup(&base); ok {
		t.Errorf("a cost-2 denial answered a cost-1 check")
	}
}

// TestCacheStoresOnlyDenialsThatEnd: allowed decisions, denials without a
// retry_after (the checks of an all-or-nothing call that fitted on their
// own) and peeks, refunds and penalties are not cached; a refund forgets
// the key.
func TestCacheStoresOnlyDenialsThatEnd(t *testing.T) {
	clk := newFakeNow()
	ch := Check{Key: "k", Limit: 3, Window: time.Minute}
	for _, tt := range []struct {
		name string
		ch   Check
		d    *Decision
	}{
		{"allowed", ch, &Decision{Allowed: true, Remaining: 2}},
		{"no retry_after", ch, denied(0, time.Second)},
		{"peek", Check{Key: "k", Limit: 3, Window: time.Minute, Peek: true}, denied(time.Second, time.Second)},
		{"penalty", Check{Key: "k", Limit: 3, Window: time.Minute, Penalty: true}, denied(time.Second, time.Second)},
	} {
		c := newDenialCache(100, clk.now)
		c.store(&tt.ch, tt.d, clk.now())
		if n := c.len(); n != 0 {
			t.Errorf("%s: store(%+v, %+v) cached it; want nothing cached", tt.name, tt.ch, *tt.d)
		}
	}
	c := newDenialCache(100, clk.now)
	c.store(&ch, denied(time.Second, time.Second), clk.now())
	c.forget("k")
	if _, ok := c.lookup(&ch); ok {
		t.Errorf("lookup after forget found the denial")
	}
}

// TestCacheBounded: the cache never holds much more than its size,
// whatever keys are denied, and expired entries leave first.
func TestCacheBounded(t *testing.T) {
	clk := newFakeNow()
	c := newDenialCache(160, clk.now)
	for i := range 10_000 {
		ch := Check{Key: fmt.Sprint("k", i), Limit: 1, Window: time.Minute}
		c.store(&ch, denied(time.Minute, time.Minute), clk.now())
	}
	if n := c.len(); n > 160 {
		t.Errorf("cache holds %d keys after 10000 denials; want at most 160", n)
	}
	// A full shard whose entries expired takes a new one without dropping
	// a live one.
	clk.add(2 * time.Minute)
	live := Check{Key: "live", Limit: 1, Window: time.Minute}
	c.store(&live, denied(time.Minute, time.Minute), clk.now())
	if _, ok := c.lookup(&live); !ok {
		t.Errorf("the newest denial is not in a full cache")
	}
}
