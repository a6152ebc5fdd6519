package actor

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// evictKey touches other keys of key's actor (the harness has one actor)
// until key has left memory, and fails the test if it does not.
func (h *harness) evictKey(key string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		v, err := h.eng.Inspect(context.Background(), key)
		if err != nil {
			h.t.Fatal(err)
		}
		if !v.InMemory {
			if !v.Found {
				h.t.Fatalf("%s left memory and is not on disk either", key)
			}
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s still in memory after %d other keys were touched", key, n)
		}
		h.hit(fmt.Sprintf("filler-%d", n), 100, 1)
		h.settle()
	}
}

// TestEvictedKeyComesBack: a key that leaves memory for its actor's key
// bound (its state stays on disk) comes back, before any decision on it,
// with its whole state: the hits of its window still count, each leaves
// the window when it would have in memory, and new hits add to them. The
// same holds when the node restarts while the key is out of memory.
func TestEvictedKeyComesBack(t *testing.T) {
	for _, restart := range []bool{false, true} {
		for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
			t.Run(fmt.Sprintf("%v/restart=%v", algo, restart), func(t *testing.T) {
				h := newHarness(t, "commit", func(c *Config) { c.MaxKeys, c.Actors = 4, 1 })
				const key, limit = "tenant-a", 10
				ch := func(cost int64) Check {
					return Check{Key: key, Limit: limit, Window: time.Minute, Cost: cost, Algorithm: algo}
				}
				start := h.clk.Now()
				h.check(ch(3))
				h.clk.Advance(20 * time.Second)
				h.check(ch(2))
				before, err := h.eng.Inspect(context.Background(), key)
				if err != nil {
					t.Fatal(err)
				}
				h.evictKey(key)
				if h.obs.evicted.Load() == 0 {
					t.Fatal("no key was evicted")
				}
				if restart {
					h.restart()
				}
				after, err := h.eng.Inspect(context.Background(), key)
				if err != nil {
					t.Fatal(err)
				}
				if after.Used != before.Used || after.Remaining != before.Remaining || after.ResetAfter != before.ResetAfter ||
					after.Lineage != before.Lineage || fmt.Sprint(after.Runs) != fmt.Sprint(before.Runs) {
					t.Fatalf("%s out of memory: %+v; in memory it was %+v", key, after, before)
				}
				if d := h.check(ch(0)); d.Remaining != before.Remaining {
					t.Fatalf("%s back in memory: remaining %d; want %d, as before it left", key, d.Remaining, before.Remaining)
				}
				if algo == SlidingLog && before.Remaining != limit-5 {
					t.Fatalf("%s before it left: remaining %d; want %d (5 hits in the window)", key, before.Remaining, limit-5)
				}
				if algo != SlidingLog {
					// The approximations: what was used still counts.
					if d := h.check(ch(before.Remaining + 1)); d.Allowed {
						t.Fatalf("%s: %d hits with %d remaining allowed: %+v", key, before.Remaining+1, before.Remaining, d)
					}
					return
				}
				// The sliding log is exact: the first 3 hits leave at 60 s,
				// the last 2 at 80 s, as they would have in memory.
				h.clk.Set(start.Add(time.Minute))
				if d := h.check(ch(0)); d.Remaining != limit-2 {
					t.Fatalf("%s at 60 s: remaining %d; want %d", key, d.Remaining, limit-2)
				}
				if d := h.check(ch(limit - 2)); !d.Allowed || d.Remaining != 0 {
					t.Fatalf("%s at 60 s: %d hits on 2 of %d = %+v; want allowed, 0 remaining", key, limit-2, limit, d)
				}
				if d := h.check(ch(1)); d.Allowed {
					t.Fatalf("%s at 60 s: an eleventh hit in the window was allowed", key)
				}
				h.clk.Set(start.Add(80 * time.Second))
				if d := h.check(ch(0)); d.Remaining != 2 {
					t.Fatalf("%s at 80 s: remaining %d; want 2", key, d.Remaining)
				}
			})
		}
	}
}
