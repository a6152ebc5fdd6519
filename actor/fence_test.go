package actor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// ownership is a node's view of which keys it owns, for Config.Owner: every
// key but those marked gone. It counts the calls to owns.
type ownership struct {
	mu    sync.RWMutex
	gone  map[string]bool
	calls atomic.Int64
}

func newOwnership() *ownership { return &ownership{gone: make(map[string]bool)} }

func (o *ownership) owns(key string) bool {
	o.calls.Add(1)
	return o.has(key)
}

// has is owns for the tests' own routing: it is not counted.
func (o *ownership) has(key string) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return !o.gone[key]
}

// move publishes that keys are no longer owned here.
func (o *ownership) move(keys ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range keys {
		o.gone[k] = true
	}
}

// TestFencedCall: a fenced call at the engine's generation never asks
// Owns; after Fence, a call routed at the older generation is refused with
// ErrStale, recording nothing, if its key moved, and decided if not; an
// unfenced call is never refused.
func TestFencedCall(t *testing.T) {
	own := newOwnership()
	h := newHarness(t, "memory", func(c *Config) { c.Owner = OwnerFunc(own.owns) })
	ctx := context.Background()
	hit := func(key string) Check { return Check{Key: key, Limit: 10, Window: time.Minute, Cost: 1} }
	do := func(key string, gen uint64) error {
		var d [1]Decision
		err := h.eng.Do(ctx, []Check{hit(key)}, d[:], CallOptions{Generation: gen})
		if err == nil && !d[0].Allowed {
			t.Fatalf("Do(%q, generation %d) = %+v; want allowed", key, gen, d[0])
		}
		return err
	}

	old := h.eng.Generation()
	if old == 0 {
		t.Fatalf("Generation() = 0; want a generation a call can carry")
	}
	for i := 0; i < 3; i++ {
		if err := do("a", old); err != nil {
			t.Fatalf("Do(a) at the current generation: %v", err)
		}
	}
	if n := own.calls.Load(); n != 0 {
		t.Errorf("Owns called %d times for calls at the current generation; want 0", n)
	}

	own.move("a")
	if g := h.eng.Fence(); g != old+1 || h.eng.Generation() != g {
		t.Fatalf("Fence() = %d, Generation() = %d; want %d for both", g, h.eng.Generation(), old+1)
	}
	tests := []struct {
		key     string
		gen     uint64
		want    error
		wantHit int64 // hits of key after the call
	}{
		{"a", old, ErrStale, 3},       // moved, routed at the old generation: refused
		{"b", old, nil, 1},            // not moved: decided
		{"a", 0, nil, 4},              // not fenced: decided
		{"a", old + 1, nil, 5},        // the caller routed after Fence: its business
		{"b", old + 1, nil, 2},        // the current generation again
		{"a", old + 100, ErrStale, 5}, // any other generation asks Owns
	}
	for _, tt := range tests {
		err := do(tt.key, tt.gen)
		if tt.want == nil && err != nil || tt.want != nil && (!errors.Is(err, tt.want) || errors.Is(err, ErrStalePartial)) {
			t.Errorf("Do(%q, generation %d) = %v; want %v", tt.key, tt.gen, err, tt.want)
		}
		if u := used(t, h.eng, tt.key); u != tt.wantHit {
			t.Errorf("after Do(%q, generation %d) it counts %d hits; want %d", tt.key, tt.gen, u, tt.wantHit)
		}
	}
	if n := own.calls.Load(); n != 3 {
		t.Errorf("Owns called %d times; want 3 (once per call at another generation)", n)
	}
}

// TestFencedCallPartlyStale: a fenced call whose keys span actors, some of
// them moved, is refused by those actors and decided by the others: Do
// says which checks were refused. A reserving or all-or-nothing call gives
// back what the other parts reserved and returns ErrStale, unless a refund
// was applied, which cannot be taken back.
func TestFencedCallPartlyStale(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			own := newOwnership()
			h := newHarness(t, mode, func(c *Config) { c.Owner = OwnerFunc(own.owns) })
			ctx := context.Background()
			gone, stay, stay2 := keyOfActor(h.eng, 0), keyOfActor(h.eng, 1), keyOfActor(h.eng, 2)
			hit := func(key string, cost int64) Check {
				return Check{Key: key, Limit: 10, Window: time.Minute, Cost: cost}
			}
			g := h.eng.Generation()
			own.move(gone)
			h.eng.Fence()

			checks := []Check{hit(stay, 1), hit(gone, 1), hit(stay2, 2)}
			out := make([]Decision, len(checks))
			err := h.eng.Do(ctx, checks, out, CallOptions{Generation: g})
			var se *StaleError
			if !errors.As(err, &se) || !errors.Is(err, ErrStalePartial) || !errors.Is(err, ErrStale) {
				t.Fatalf("Do(%v) = %v; want a *StaleError matching ErrStalePartial and ErrStale", checks, err)
			}
			if !slices.Equal(se.Refused, []int{1}) {
				t.Errorf("Refused = %v; want [1]", se.Refused)
			}
			if !out[0].Allowed || !out[2].Allowed || out[1] != (Decision{}) {
				t.Errorf("decisions = %+v; want allowed, zero, allowed", out)
			}
			for key, want := range map[string]int64{stay: 1, gone: 0, stay2: 2} {
				if u := used(t, h.eng, key); u != want {
					t.Errorf("after the partly stale call %q counts %d hits; want %d", key, u, want)
				}
			}

			reserving := []struct {
				name   string
				opt    CallOptions
				checks []Check
				want   error
				hits   map[string]int64 // after the call
			}{
				{"marks", CallOptions{Generation: g, Marks: make([]int64, 3)}, checks, ErrStale, map[string]int64{stay: 1, gone: 0, stay2: 2}},
				{"all or nothing", CallOptions{Generation: g, AllOrNothing: true}, checks, ErrStale, map[string]int64{stay: 1, gone: 0, stay2: 2}},
				{"refund kept", CallOptions{Generation: g, AllOrNothing: true},
					[]Check{{Key: stay, Limit: 10, Window: time.Minute, Cost: 1, Refund: true}, hit(gone, 1), hit(stay2, 2)},
					ErrStalePartial, map[string]int64{stay: 0, gone: 0, stay2: 2}},
			}
			for _, tt := range reserving {
				out := make([]Decision, len(tt.checks))
				err := h.eng.Do(ctx, tt.checks, out, tt.opt)
				partial := errors.Is(err, ErrStalePartial)
				if !errors.Is(err, ErrStale) || partial != (tt.want == ErrStalePartial) {
					t.Errorf("%s: Do = %v; want %v", tt.name, err, tt.want)
				}
				for key, want := range tt.hits {
					if u := used(t, h.eng, key); u != want {
						t.Errorf("%s: after the stale call %q counts %d hits; want %d", tt.name, key, u, want)
					}
				}
			}
		})
	}
}

// TestFenceNoDecisionAfterCollect: the handoff's ordering guarantee. While
// callers send fenced calls (reading the generation, then routing by the
// ownership they see), ownership of a quarter of the keys moves away each
// round: publish, Fence, Collect, Forget. Every check on a moved key that
// was decided (acknowledged) is in what Collect returned, and none was
// decided after: Forget finds every collected key unchanged, and the moved
// keys hold nothing afterwards. A quarter of the calls are all or nothing,
// and an eighth of the keys fill up: what such a call reserved and then
// released (after a denial, or a part refused as stale) is not in what
// Collect returned either.
func TestFenceNoDecisionAfterCollect(t *testing.T) {
	const (
		nkeys   = 64
		rounds  = 3
		callers = 8
		calls   = 300 // per caller, between two moves
	)
	own := newOwnership()
	h := newHarness(t, "commit", func(c *Config) {
		c.Owner = OwnerFunc(own.owns)
		c.MaxKeys = 16 // 4 keys per actor: keys go to disk and come back
	})
	ctx := context.Background()
	// An eighth of the keys fill up: denials, and all-or-nothing calls
	// that release what they reserved.
	limit := func(i int) int64 {
		if i%8 == 7 {
			return 40
		}
		return 1 << 30
	}
	keys := make([]string, nkeys)
	index := make(map[string]int)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		index[keys[i]] = i
	}
	var acked [nkeys]atomic.Int64 // hits acknowledged as allowed, per key
	var done, stale, partial atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopCallers := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(stopCallers) // before the harness's: the engine closes after
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				gen := h.eng.Generation() // before routing
				var checks []Check
				for n := 1 + rng.IntN(3); n > 0; n-- {
					i := rng.IntN(nkeys)
					if own.has(keys[i]) {
						checks = append(checks, Check{Key: keys[i], Limit: limit(i), Window: time.Hour, Algorithm: Algorithm(i % 3), Cost: 1})
					}
				}
				if len(checks) == 0 {
					continue
				}
				if rng.IntN(2) == 0 {
					// A call on its way (a forwarded call, say) while the
					// ownership moves.
					time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond) // not a poll: a random delay between routing and the call
				}
				out := make([]Decision, len(checks))
				opt := CallOptions{Generation: gen, AllOrNothing: rng.IntN(4) == 0}
				err := h.eng.Do(ctx, checks, out, opt)
				decided := make([]bool, len(checks))
				var se *StaleError
				switch {
				case err == nil:
					for i := range decided {
						decided[i] = true
					}
				case errors.As(err, &se) && !opt.AllOrNothing:
					partial.Add(1)
					for i := range decided {
						decided[i] = !slices.Contains(se.Refused, i)
					}
				case errors.Is(err, ErrStale) && !errors.Is(err, ErrStalePartial):
					stale.Add(1) // nothing recorded
				default:
					t.Errorf("Do(%v, %+v) = %v", checks, opt, err)
					return
				}
				for i, ok := range decided {
					if ok && out[i].Allowed {
						acked[index[checks[i].Key]].Add(1)
					}
				}
				done.Add(1)
			}
		}()
	}
	waitCalls := func() {
		target := done.Load() + callers*calls
		testkit.Eventually(t, 10*time.Second, func() bool { return done.Load() >= target || t.Failed() }, "the callers to make their calls")
	}

	collected := make(map[string]Exported)
	for r := 0; r < rounds; r++ {
		waitCalls()
		var moving []string
		for i, k := range keys {
			if i%4 == r {
				moving = append(moving, k)
			}
		}
		own.move(moving...)
		h.eng.Fence()
		var got []Exported
		movedNow := func(key string) bool { return index[key]%4 == r }
		if _, err := h.eng.Collect(ctx, movedNow, func(x Exported) error {
			got = append(got, x)
			return nil
		}); err != nil {
			t.Fatalf("round %d: Collect: %v", r, err)
		}
		for _, x := range got {
			collected[x.Key] = x
		}
		n, err := h.eng.Forget(ctx, got)
		if err != nil || n != len(got) {
			t.Fatalf("round %d: Forget(%d collected keys) = %d, %v; want %d, nil: a key changed after Collect", r, len(got), n, err, len(got))
		}
	}
	waitCalls()
	stopCallers()
	t.Logf("%d calls, %d refused as stale, %d partly", done.Load(), stale.Load(), partial.Load())

	now := h.clk.Now()
	for i, key := range keys {
		moved := i%4 < rounds
		var inCollect int64
		if x, ok := collected[key]; ok {
			inCollect = usedIn(t, x, now)
		}
		here := used(t, h.eng, key)
		switch {
		case moved && inCollect != acked[i].Load():
			t.Errorf("%s moved: Collect returned %d hits; %d were acknowledged", key, inCollect, acked[i].Load())
		case moved && here != 0:
			t.Errorf("%s moved: it counts %d hits here after Forget; want 0 (decided after Collect)", key, here)
		case !moved && here != acked[i].Load():
			t.Errorf("%s stayed: it counts %d hits; %d were acknowledged", key, here, acked[i].Load())
		}
	}
}

// TestCollectWaitsForReservingCalls: Collect does not read while a fenced
// reserving call made before the Fence is in flight (it could still release
// what it reserved), and reads once it has finished.
func TestCollectWaitsForReservingCalls(t *testing.T) {
	b := newBlocker()
	h := newHarness(t, "memory", func(c *Config) { c.Owner = OwnerFunc(b.owns) })
	b.key = "parked"
	h.hit("key-0", 10, 1)
	g := h.eng.Generation()
	h.eng.Fence()
	errc := make(chan error, 1)
	go func() {
		var d [1]Decision
		// Made at the old generation: its actor asks Owns, which parks it.
		errc <- h.eng.Do(context.Background(), []Check{{Key: b.key, Limit: 1, Window: time.Second, Cost: 1}}, d[:], CallOptions{Generation: g, AllOrNothing: true})
	}()
	<-b.entered

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	n, err := h.eng.Collect(ctx, func(string) bool { return true }, func(Exported) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || n != 0 {
		t.Fatalf("Collect during a reserving call of the old generation = %d, %v; want 0, context.DeadlineExceeded (it waits)", n, err)
	}
	close(b.release)
	if err := <-errc; err != nil {
		t.Fatalf("the parked call: %v", err)
	}
	got := collectAll(t, h.eng, func(string) bool { return true })
	if len(got) != 2 {
		t.Errorf("Collect after the call = %d keys; want 2 (key-0 and %s)", len(got), b.key)
	}
}
