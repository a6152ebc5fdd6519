package actor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// handoffKeys records hits on n keys, key-i getting i%5+1 hits of a limit of
// 100 a minute, and returns the hits of each key.
func handoffKeys(h *harness, n int) map[string]int64 {
	h.t.Helper()
	hits := make(map[string]int64)
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("key-%d", i)
		hits[key] = int64(i%5) + 1
		h.hit(key, 100, hits[key])
	}
	h.settle()
	return hits
}

// used returns how many hits key counts now on e (0 if it holds nothing).
func used(t testing.TB, e *Engine, key string) int64 {
	t.Helper()
	ks, err := e.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return ks.Used
}

// usedIn returns how many hits the encoded state x counts at now.
func usedIn(t testing.TB, x Exported, now time.Time) int64 {
	t.Helper()
	var st state
	if err := st.decode(x.State); err != nil {
		t.Fatalf("decode the state of %q: %v", x.Key, err)
	}
	return st.usedAt(now.UnixNano())
}

func evenKey(key string) bool {
	var i int
	_, err := fmt.Sscanf(key, "key-%d", &i)
	return err == nil && i%2 == 0
}

// collectAll runs Collect and returns what fn received, by key; a key
// received twice fails the test.
func collectAll(t testing.TB, e *Engine, moved func(string) bool) map[string]Exported {
	t.Helper()
	got := make(map[string]Exported)
	n, err := e.Collect(context.Background(), moved, func(x Exported) error {
		if _, ok := got[x.Key]; ok {
			t.Errorf("Collect gave %q twice", x.Key)
		}
		got[x.Key] = x
		return nil
	})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if n != len(got) {
		t.Errorf("Collect = %d; fn received %d states", n, len(got))
	}
	return got
}

// TestCollectChangesNothing: Collect returns the state of every moved key
// that holds hits, from memory and from disk, once each, and leaves every
// key as it was, without loading any into memory.
func TestCollectChangesNothing(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, func(c *Config) {
				if mode != "memory" {
					c.MaxKeys = 8 // 2 keys per actor: most keys are only on disk
				}
			})
			hits := handoffKeys(h, 40)
			// key-40 has emptied by the time of the Collect (its hit has
			// expired), and key-42 too (its hit was refunded): both are
			// skipped.
			h.check(Check{Key: "key-40", Limit: 100, Window: time.Second, Cost: 1})
			h.hit("key-42", 100, 1)
			h.check(Check{Key: "key-42", Limit: 100, Window: time.Minute, Cost: 1, Refund: true})
			h.settle()
			h.clk.Advance(2 * time.Second)
			inMemory := h.obs.keys.Load()

			got := collectAll(t, h.eng, evenKey)
			for key, want := range hits {
				x, ok := got[key]
				switch {
				case evenKey(key) && !ok:
					t.Errorf("Collect(even keys) did not return %q", key)
				case !evenKey(key) && ok:
					t.Errorf("Collect(even keys) returned %q", key)
				case ok && usedIn(t, x, h.clk.Now()) != want:
					t.Errorf("Collect: %q counts %d hits; want %d", key, usedIn(t, x, h.clk.Now()), want)
				}
			}
			for _, key := range []string{"key-40", "key-42"} {
				if _, ok := got[key]; ok {
					t.Errorf("Collect returned %s, whose state is empty", key)
				}
			}
			if len(got) != 20 {
				t.Errorf("Collect returned %d keys; want 20", len(got))
			}
			// Keys may leave memory on their alarms meanwhile, never come.
			if n := h.obs.keys.Load(); n > inMemory {
				t.Errorf("keys in memory = %d after Collect; want at most %d (it loads nothing)", n, inMemory)
			}
			for key, want := range hits {
				if u := used(t, h.eng, key); u != want {
					t.Errorf("after Collect %q counts %d hits; want %d (Collect changes nothing)", key, u, want)
				}
			}
		})
	}
}

// TestForgetOnlyUnchanged: Forget deletes, in memory and durably on disk,
// the keys whose state is still the one Collect read, counting those that
// hold nothing too, and keeps a key that changed since (a hit, an Import).
// A key reloaded from disk, whose expired hits were pruned, is unchanged.
func TestForgetOnlyUnchanged(t *testing.T) {
	for _, mode := range []string{"memory", "commit"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, mode, nil)
			// key-0 holds a hit that expires between Collect and Forget.
			h.hit("key-0", 100, 1)
			h.clk.Advance(30 * time.Second)
			hits := handoffKeys(h, 20)
			h.clk.Advance(10 * time.Second)
			got := collectAll(t, h.eng, evenKey)
			if len(got) != 10 {
				t.Fatalf("Collect(even keys) returned %d keys; want 10", len(got))
			}

			h.hit("key-2", 100, 1) // changed since: kept
			// Merged since with another history's hits (here, the same
			// hits under another lineage: they add up): kept.
			other := Exported{Key: "key-4", State: withLineage(t, got["key-4"].State, 42)}
			if err := h.eng.Import(context.Background(), []Exported{other}); err != nil {
				t.Fatal(err)
			}
			h.clk.Advance(25 * time.Second) // key-0's first hits have expired
			if mode != "memory" {
				h.restart() // every key is on disk only: Forget loads them
			}
			keys := make([]Exported, 0, len(got)+1)
			for _, x := range got {
				keys = append(keys, x)
			}
			keys = append(keys, Exported{Key: "never-seen", State: got["key-6"].State})
			n, err := h.eng.Forget(context.Background(), keys)
			if err != nil {
				t.Fatalf("Forget: %v", err)
			}
			if n != len(keys)-2 {
				t.Errorf("Forget(%d keys) = %d; want %d (all but key-2 and key-4)", len(keys), n, len(keys)-2)
			}
			if h.store != nil {
				// Forget returned after the commit: the store has the deletes.
				all := slices.Sorted(maps.Keys(got))
				var found []string
				if err := h.store.Get(all, func(i int, _ int64, _ []byte) { found = append(found, all[i]) }); err != nil {
					t.Fatal(err)
				}
				slices.Sort(found)
				if strings.Join(found, ",") != "key-2,key-4" {
					t.Errorf("on disk after Forget: %v; want key-2 and key-4", found)
				}
				h.restart()
			}
			for key := range got {
				want := int64(0)
				switch key {
				case "key-2":
					want = hits[key] + 1
				case "key-4":
					want = 2 * hits[key]
				}
				if u := used(t, h.eng, key); u != want {
					t.Errorf("after Forget %q counts %d hits; want %d", key, u, want)
				}
			}
			if u := used(t, h.eng, "key-1"); u != hits["key-1"] {
				t.Errorf("after Forget key-1 (not handed over) counts %d hits; want %d", u, hits["key-1"])
			}
		})
	}
}

// withLineage returns the encoded state b with another lineage.
func withLineage(t testing.TB, b []byte, lineage uint64) []byte {
	t.Helper()
	var st state
	if err := st.decode(b); err != nil {
		t.Fatal(err)
	}
	st.lineage = lineage
	return st.appendBinary(nil)
}

// handOver moves the keys for which moved is true from one engine to
// another as the cluster does: Collect, Import on the receiver (which
// returns once it committed them), then Forget what the receiver has. A
// failed Collect still sends what it read, and forgets nothing.
func handOver(ctx context.Context, from, to *Engine, moved func(string) bool) error {
	var got []Exported
	_, cerr := from.Collect(ctx, moved, func(x Exported) error {
		got = append(got, x)
		return nil
	})
	if err := to.Import(context.WithoutCancel(ctx), got); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	if cerr != nil {
		return cerr
	}
	_, err := from.Forget(ctx, got)
	return err
}

// checkNoHitLost checks that every key counts, on the sender and the
// receiver together, at least the hits it was given: a failed handoff may
// count a key twice (on both), never lose one.
func checkNoHitLost(t testing.TB, from, to *Engine, hits map[string]int64, when string) {
	t.Helper()
	lost := 0
	for key, want := range hits {
		a, b := used(t, from, key), used(t, to, key)
		if a+b < want {
			lost++
			t.Errorf("%s: %q counts %d hits here and %d on the receiver; want at least %d in all", when, key, a, b, want)
		}
	}
	if lost > 0 {
		t.Errorf("%s: %d of %d keys lost hits", when, lost, len(hits))
	}
}

// checkHandedOver checks that the receiver holds every moved key's hits
// and the sender none of them.
func checkHandedOver(t testing.TB, from, to *Engine, hits map[string]int64) {
	t.Helper()
	for key, want := range hits {
		if !evenKey(key) {
			continue
		}
		if a, b := used(t, from, key), used(t, to, key); a != 0 || b < want {
			t.Errorf("after the handoff %q counts %d hits here and %d on the receiver; want 0 and at least %d", key, a, b, want)
		}
	}
}

// blocker parks an actor inside Config.Owner, for tests that need an actor
// busy and its mailbox full.
type blocker struct {
	key     string // Owns blocks on this key
	entered chan struct{}
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (b *blocker) owns(key string) bool {
	if key == b.key {
		b.entered <- struct{}{}
		<-b.release
	}
	return true
}

// fill parks the actor of b.key and fills its mailbox of one call, so that
// the next call sent to that actor fails with ErrOverloaded. The returned
// function lets the actor go and waits for both calls.
func (b *blocker) fill(t testing.TB, h *harness) (unblock func()) {
	t.Helper()
	i := shardOf(h.eng, b.key)
	var wg sync.WaitGroup
	call := func(c Check, gen uint64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d [1]Decision
			if err := h.eng.Do(context.Background(), []Check{c}, d[:], CallOptions{Generation: gen}); err != nil {
				t.Errorf("Do(%q) parked in Owns: %v", c.Key, err)
			}
		}()
	}
	// A generation other than the engine's makes the actor ask Owns.
	call(Check{Key: b.key, Limit: 1, Window: time.Second}, h.eng.Generation()+100)
	<-b.entered
	call(Check{Key: b.key, Limit: 1, Window: time.Second}, 0)
	testkit.Eventually(t, 10*time.Second, func() bool { return len(h.eng.actors[i].mailbox) == 1 }, "the parked actor's mailbox to fill")
	return func() {
		close(b.release)
		wg.Wait()
	}
}

// TestHandoffKeepsStateThroughFaults: a handoff done with Collect and
// Forget never loses a hit, whatever fails during it (a cancelled context,
// the engine closing, a full mailbox), and a later handoff completes it.
// Export lost the states it had cleared in each of these cases.
func TestHandoffKeepsStateThroughFaults(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		h := newHarness(t, "commit", nil)
		to := newHarness(t, "commit", nil)
		hits := handoffKeys(h, 40)
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		var once sync.Once
		moved := func(key string) bool {
			// The caller gives up while the actors read the keys.
			once.Do(func() {
				cancel()
				<-release
			})
			return evenKey(key)
		}
		errc := make(chan error, 1)
		go func() { errc <- handOver(ctx, h.eng, to.eng, moved) }()
		err := <-errc
		close(release)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handoff with a cancelled context = %v; want context.Canceled", err)
		}
		h.settle()
		checkNoHitLost(t, h.eng, to.eng, hits, "after the cancelled handoff")
		if err := handOver(context.Background(), h.eng, to.eng, evenKey); err != nil {
			t.Fatalf("handoff again: %v", err)
		}
		checkHandedOver(t, h.eng, to.eng, hits)
	})

	t.Run("closing", func(t *testing.T) {
		h := newHarness(t, "commit", nil)
		to := newHarness(t, "commit", nil)
		hits := handoffKeys(h, 40)
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		moved := func(key string) bool {
			once.Do(func() {
				close(entered)
				<-release
			})
			return evenKey(key)
		}
		errc := make(chan error, 1)
		go func() { errc <- handOver(context.Background(), h.eng, to.eng, moved) }()
		<-entered
		// Hold the store's writer, so that no write of the handoff can
		// commit before the engine has closed.
		unpause := make(chan struct{})
		h.store.Submit([]persist.Record{{Key: "pause"}}, func(error) { <-unpause })
		closed := make(chan error, 1)
		go func() { closed <- h.eng.Close() }()
		testkit.Eventually(t, 10*time.Second, h.eng.closing.Load, "Close to start")
		close(release)
		err := <-errc
		close(unpause)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("handoff while closing = %v; want ErrClosed", err)
		}
		h.restart()
		checkNoHitLost(t, h.eng, to.eng, hits, "after the handoff cut by Close")
		if err := handOver(context.Background(), h.eng, to.eng, evenKey); err != nil {
			t.Fatalf("handoff again: %v", err)
		}
		checkHandedOver(t, h.eng, to.eng, hits)
	})

	t.Run("overloaded", func(t *testing.T) {
		b := newBlocker()
		h := newHarness(t, "commit", func(c *Config) {
			// Many actors: a call that meets the full mailbox of the last
			// one has been sent to many others before (Export lost what
			// they had cleared).
			c.Actors = 2048
			c.MailboxSize = 1
			c.Owner = OwnerFunc(b.owns)
		})
		to := newHarness(t, "commit", nil)
		last := len(h.eng.actors) - 1 // the last actor a call reaches
		b.key = keyOfActor(h.eng, last)
		hits := handoffKeys(h, 1000)
		for i := 1000; ; i += 2 { // a moved key on the last actor
			if key := fmt.Sprintf("key-%d", i); shardOf(h.eng, key) == last {
				hits[key] = 3
				h.hit(key, 100, 3)
				break
			}
		}

		// A full mailbox while the keys are read: Collect fails, and
		// nothing changed.
		unblock := b.fill(t, h)
		if err := handOver(context.Background(), h.eng, to.eng, evenKey); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("handoff with a full mailbox = %v; want ErrOverloaded", err)
		}
		unblock()
		h.settle()
		checkNoHitLost(t, h.eng, to.eng, hits, "after Collect met a full mailbox")

		// A full mailbox while the keys are forgotten: some are, some are
		// not, and the receiver has them all.
		var got []Exported
		if _, err := h.eng.Collect(context.Background(), evenKey, func(x Exported) error {
			got = append(got, x)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := to.eng.Import(context.Background(), got); err != nil {
			t.Fatal(err)
		}
		b.release = make(chan struct{})
		unblock = b.fill(t, h)
		if _, err := h.eng.Forget(context.Background(), got); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("Forget with a full mailbox = %v; want ErrOverloaded", err)
		}
		unblock()
		h.settle()
		checkNoHitLost(t, h.eng, to.eng, hits, "after Forget met a full mailbox")
		n, err := h.eng.Forget(context.Background(), got)
		if err != nil || n != len(got) {
			t.Fatalf("Forget again = %d, %v; want %d, nil", n, err, len(got))
		}
		checkHandedOver(t, h.eng, to.eng, hits)
	})
}
