package actor

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestCheckAllOrNothing: hits are recorded only if every check of the call
// fits, across actors; a failed call leaves every key as it was.
func TestCheckAllOrNothing(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			h.hit("full", 2, 2)
			var checks []Check
			for i := 0; i < 8; i++ {
				checks = append(checks, Check{Key: fmt.Sprintf("free-%d", i), Limit: 5, Window: time.Minute, Cost: 2})
			}
			checks = append(checks, Check{Key: "full", Limit: 2, Window: time.Minute, Cost: 1})
			out := make([]Decision, len(checks))
			if err := h.eng.CheckAll(context.Background(), checks, out); err != nil {
				t.Fatal(err)
			}
			for i, d := range out {
				if d.Allowed {
					t.Errorf("CheckAll check %d (%s) = %+v; want denied: one check of the call did not fit", i, checks[i].Key, d)
				}
				if i < 8 && (d.RetryAfter != 0 || d.Remaining != 5) {
					t.Errorf("check %d = %+v; want retry_after 0 and 5 remaining (it fitted, nothing kept)", i, d)
				}
			}
			for i := 0; i < 8; i++ {
				if d := h.check(Check{Key: fmt.Sprintf("free-%d", i), Limit: 5, Window: time.Minute}); d.Remaining != 5 {
					t.Errorf("after the failed call free-%d has %d remaining; want 5", i, d.Remaining)
				}
			}
			// Without the full key, the same call is recorded whole; a key
			// named twice counts twice.
			checks = append(checks[:8], checks[0])
			out = out[:len(checks)]
			if err := h.eng.CheckAll(context.Background(), checks, out); err != nil {
				t.Fatal(err)
			}
			for i, d := range out {
				if !d.Allowed {
					t.Errorf("check %d = %+v; want allowed", i, d)
				}
			}
			if d := h.check(Check{Key: "free-0", Limit: 5, Window: time.Minute}); d.Remaining != 1 {
				t.Errorf("free-0 remaining = %d; want 1", d.Remaining)
			}
		})
	}
}

// TestReleaseTakesBackExactlyTheReservedHits: a release removes the hits the
// failed call recorded, not hits recorded after them by others.
func TestReleaseTakesBackExactlyTheReservedHits(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			var st state
			c := Check{Key: "k", Limit: 10, Window: time.Minute, Algorithm: algo, Cost: 3}
			var d Decision
			now := epoch.UnixNano()
			st.decide(now, &c, 1000, &d)
			mark := st.mark()
			c.Cost = 2
			st.decide(now+int64(time.Second), &c, 1000, &d) // someone else, later
			if !st.release(mark, 3) {
				t.Fatalf("release(%d, 3) changed nothing", mark)
			}
			if got := st.usedAt(now + int64(time.Second)); got != 2 {
				t.Fatalf("after release used = %d; want 2", got)
			}
		})
	}
}

// TestInspectResetList: the admin view agrees with the decisions, a reset
// forgets a key in memory and on disk, and listings see both.
func TestInspectResetList(t *testing.T) {
	h := newHarness(t, "commit", func(c *Config) { c.MaxKeys, c.Actors = 2, 1 })
	h.hit("tenant:a", 10, 3)
	h.clk.Advance(time.Second)
	h.hit("tenant:a", 10, 2)
	h.hit("tenant:b", 10, 1)
	h.hit("tenant:c", 10, 1) // one of a, b, c is now only on disk
	h.hit("other", 10, 1)
	ctx := context.Background()

	v, err := h.eng.Inspect(ctx, "tenant:a")
	if err != nil {
		t.Fatal(err)
	}
	if !v.Found || v.Used != 5 || v.Remaining != 5 || len(v.Runs) != 2 || v.Runs[0].Count != 3 || v.Runs[1].Count != 2 {
		t.Fatalf("Inspect(tenant:a) = %+v; want 5 used in runs of 3 and 2", v)
	}
	if want := epoch.Add(time.Second + time.Minute); !v.ExpiresAt.Equal(want) {
		t.Fatalf("ExpiresAt = %v; want %v", v.ExpiresAt, want)
	}
	keys, err := h.eng.List(ctx, "tenant:", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys[0].Key != "tenant:a" || keys[2].Key != "tenant:c" {
		t.Fatalf("List(tenant:) = %+v; want tenant:a, tenant:b, tenant:c", keys)
	}
	inMemory := 0
	for _, k := range keys {
		if k.InMemory {
			inMemory++
		}
	}
	if inMemory == 3 {
		t.Fatalf("List says all keys are in memory; the bound is 2")
	}
	if page, _ := h.eng.List(ctx, "tenant:", "tenant:a", 1); len(page) != 1 || page[0].Key != "tenant:b" {
		t.Fatalf("List(after tenant:a, 1) = %+v; want tenant:b", page)
	}
	for _, key := range []string{"tenant:a", "tenant:b", "tenant:c"} {
		existed, err := h.eng.Reset(ctx, key)
		if err != nil || !existed {
			t.Fatalf("Reset(%s) = %v, %v; want true", key, existed, err)
		}
	}
	if existed, _ := h.eng.Reset(ctx, "never"); existed {
		t.Fatal("Reset(never) = true; want false")
	}
	h.restart()
	if d := h.hit("tenant:a", 10, 0); d.Remaining != 10 {
		t.Fatalf("after reset and restart tenant:a remaining = %d; want 10", d.Remaining)
	}
	if v, _ := h.eng.Inspect(ctx, "tenant:b"); v.Found {
		t.Fatalf("Inspect(tenant:b) after reset = %+v; want not found", v)
	}
	if v, _ := h.eng.Inspect(ctx, "other"); !v.Found || v.Used != 1 {
		t.Fatalf("Inspect(other) = %+v; want 1 used", v)
	}
}
