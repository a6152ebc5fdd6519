package actor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

type modelHit struct {
	at   time.Time
	cost int64
}

// TestExactUnderConcurrency: many goroutines hit a handful of keys with
// random costs while the fake clock moves. A reference model, the sorted
// list of allowed hits per key, confirms that no interval as long as the
// window ever held more than the limit and that every denial was justified.
//
// The clock moves between rounds, so every decision of a round was made at
// that round's time; within a round the order is up to the actors. A denial
// is justified when, even counting every hit allowed in its round, its cost
// did not fit.
func TestExactUnderConcurrency(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			const (
				keys       = 5
				goroutines = 8
				rounds     = 200
				limit      = 10
				window     = time.Second
			)
			rng := rand.New(rand.NewPCG(1, 2))
			allowed := make(map[string][]modelHit)
			type denial struct {
				key  string
				at   time.Time
				cost int64
			}
			var denials []denial
			var mu sync.Mutex
			for r := 0; r < rounds; r++ {
				now := h.clk.Now()
				var wg sync.WaitGroup
				for g := 0; g < goroutines; g++ {
					n := 1 + rng.IntN(3)
					checks := make([]Check, n)
					for i := range checks {
						checks[i] = Check{Key: fmt.Sprintf("k%d", rng.IntN(keys)), Limit: limit, Window: window, Cost: rng.Int64N(limit/2 + 1)}
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						out := make([]Decision, len(checks))
						if err := h.eng.Check(context.Background(), checks, out); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						defer mu.Unlock()
						for i, d := range out {
							c := checks[i]
							if d.Allowed {
								allowed[c.Key] = append(allowed[c.Key], modelHit{now, c.Cost})
							} else {
								denials = append(denials, denial{c.Key, now, c.Cost})
							}
						}
					}()
				}
				wg.Wait()
				h.clk.Advance(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			}
			used := func(key string, at time.Time) int64 { // hits in (at-window, at]
				var n int64
				for _, hit := range allowed[key] {
					if !hit.at.After(at) && hit.at.After(at.Add(-window)) {
						n += hit.cost
					}
				}
				return n
			}
			for key, hits := range allowed {
				sort.Slice(hits, func(i, j int) bool { return hits[i].at.Before(hits[j].at) })
				for _, hit := range hits {
					if n := used(key, hit.at); n > limit {
						t.Fatalf("%s: %d hits allowed in the window ending %v; limit %d", key, n, hit.at.Sub(epoch), limit)
					}
				}
			}
			for _, d := range denials {
				if n := used(d.key, d.at); n+d.cost <= limit {
					t.Fatalf("%s: cost %d denied at %v with only %d used of %d", d.key, d.cost, d.at.Sub(epoch), n, limit)
				}
			}
			t.Logf("%d keys, %d denials checked", len(allowed), len(denials))
		})
	}
}

// TestEvictionStaysExact: with room for K keys in memory and 10×K keys in
// use, every decision is still exact (evicted keys load again before any
// decision on them) and the keys in memory stay within the bound.
func TestEvictionStaysExact(t *testing.T) {
	const maxKeys, actors = 40, 4
	h := newHarness(t, "commit", func(c *Config) { c.MaxKeys, c.Actors = maxKeys, actors })
	rng := rand.New(rand.NewPCG(3, 4))
	used := make(map[string]int64)
	for i := 0; i < 4000; i++ {
		key := fmt.Sprintf("tenant-%d", rng.IntN(10*maxKeys))
		d := h.hit(key, 20, 1)
		want := used[key] < 20
		if want {
			used[key]++
		}
		if d.Allowed != want || d.Remaining != 20-used[key] {
			t.Fatalf("hit %d on %s = %+v; want allowed=%v remaining %d", i, key, d, want, 20-used[key])
		}
		if got := h.obs.keys.Load(); got > maxKeys+actors {
			t.Fatalf("after hit %d: %d keys in memory; bound %d (+%d in flight)", i, got, maxKeys, actors)
		}
	}
	if h.obs.evicted.Load() == 0 {
		t.Fatal("no key was evicted; the test does not exercise eviction")
	}
}

// TestMemoryModeBound: without a data file, a node at its key bound refuses
// new keys instead of forgetting live ones, and takes them again once keys
// have emptied.
func TestMemoryModeBound(t *testing.T) {
	h := newHarness(t, "memory", func(c *Config) { c.MaxKeys, c.Actors = 4, 1 })
	for i := 0; i < 4; i++ {
		h.hit(fmt.Sprintf("k%d", i), 5, 1)
	}
	var d [1]Decision
	err := h.eng.Check(context.Background(), []Check{{Key: "k4", Limit: 5, Window: time.Minute, Cost: 1}}, d[:])
	if err != ErrTooManyKeys {
		t.Fatalf("fifth key = %v; want ErrTooManyKeys", err)
	}
	h.clk.Advance(time.Minute)
	testkit.Eventually(t, 10*time.Second, func() bool { return h.obs.keys.Load() == 0 }, "keys to expire")
	h.hit("k4", 5, 1)
}

// TestMemoryModeBoundConcurrent: calls for new keys that reach the actor
// together (one batch) each count against the bound with the others: the
// node never holds more keys than it may.
func TestMemoryModeBoundConcurrent(t *testing.T) {
	const maxKeys = 8
	h := newHarness(t, "memory", func(c *Config) { c.MaxKeys, c.Actors = maxKeys, 1 })
	var wg sync.WaitGroup
	var allowed atomic.Int64
	for i := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d [1]Decision
			err := h.eng.Check(context.Background(), []Check{{Key: fmt.Sprintf("k%03d", i), Limit: 5, Window: time.Minute, Cost: 1}}, d[:])
			switch {
			case err == nil:
				allowed.Add(1)
			case err != ErrTooManyKeys:
				t.Errorf("key %d: %v; want nil or ErrTooManyKeys", i, err)
			}
		}()
	}
	wg.Wait()
	if got := h.obs.keys.Load(); got > maxKeys || allowed.Load() > maxKeys {
		t.Errorf("%d keys in memory, %d calls allowed; the bound is %d", got, allowed.Load(), maxKeys)
	}
}

// TestMemoryModeBoundRecordsNothing: in memory mode, a call whose checks
// span actors and that one actor refuses for its key bound records nothing
// on the others either.
func TestMemoryModeBoundRecordsNothing(t *testing.T) {
	h := newHarness(t, "memory", func(c *Config) { c.MaxKeys, c.Actors = 2, 2 })
	var of0, of1 []string // keys of actor 0 and of actor 1
	for n := 0; len(of0) < 2 || len(of1) < 1; n++ {
		k := fmt.Sprintf("key-%d", n)
		if shardOf(h.eng, k) == 0 {
			of0 = append(of0, k)
		} else {
			of1 = append(of1, k)
		}
	}
	h.hit(of0[0], 5, 1) // actor 0 is full
	checks := []Check{
		{Key: of1[0], Limit: 5, Window: time.Minute, Cost: 2},
		{Key: of0[1], Limit: 5, Window: time.Minute, Cost: 1},
	}
	out := make([]Decision, len(checks))
	if err := h.eng.Check(context.Background(), checks, out); err != ErrTooManyKeys {
		t.Fatalf("a call with a new key on a full actor = %v; want ErrTooManyKeys", err)
	}
	var d [1]Decision
	if err := h.eng.Check(context.Background(), []Check{{Key: of1[0], Limit: 5, Window: time.Minute}}, d[:]); err != nil {
		t.Fatal(err)
	}
	if d[0].Remaining != 5 {
		t.Errorf("%s after the refused call: remaining %d; want 5 (nothing recorded)", of1[0], d[0].Remaining)
	}
}
