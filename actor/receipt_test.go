package actor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// collectKey returns the state of key on e, as Collect hands it over.
func collectKey(t testing.TB, e *Engine, key string) Exported {
	t.Helper()
	got := collectAll(t, e, func(k string) bool { return k == key })
	x, ok := got[key]
	if !ok {
		t.Fatalf("Collect found no state for %q", key)
	}
	return x
}

// importKey imports x into e.
func importKey(t testing.TB, e *Engine, x Exported) {
	t.Helper()
	if err := e.Import(context.Background(), []Exported{x}); err != nil {
		t.Fatalf("Import(%q): %v", x.Key, err)
	}
}

// TestImportAgainCountsOnce: a handed-over state that arrives twice (the
// sender retried a handoff whose answer it did not get, after the
// receiver committed it), or a newer version of it (the sender's state
// changed after it was read), is counted once on a receiver that holds
// hits of its own, of another lineage, for every algorithm, in memory and
// after the key left memory. The receipt ends with the next change of the
// key here, after which a resent state adds up again (over-counting, never
// under), as it does after a restart.
func TestImportAgainCountsOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			const key = "k"
			hit := func(h *harness, cost int64) {
				t.Helper()
				// A window of a day: what a bucket refills in the second
				// the test waits is below one hit.
				h.check(Check{Key: key, Limit: 100, Window: 24 * time.Hour, Algorithm: algo, Cost: cost})
			}
			to := newHarness(t, "commit", nil)
			from := newHarness(t, "commit", nil)
			hit(to, 7)   // the receiver's own history (it took the key over from empty)
			hit(from, 3) // the sender's, of another lineage
			old := collectKey(t, from.eng, key)
			want := int64(7 + 3)

			importKey(t, to.eng, old)
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("after the first import: %d used; want %d", got, want)
			}
			importKey(t, to.eng, old) // the sender's retry
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("the same state imported again: %d used; want %d (its hits counted once)", got, want)
			}

			// The sender's state changed after it was read: the newer
			// version comes in the next round.
			to.clk.Advance(time.Second)
			from.clk.Advance(time.Second)
			hit(from, 2)
			newer := collectKey(t, from.eng, key)
			want += 2
			importKey(t, to.eng, newer)
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("a newer version imported: %d used; want %d", got, want)
			}
			importKey(t, to.eng, old) // a late older version
			importKey(t, to.eng, newer)
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("older and newer versions imported again: %d used; want %d", got, want)
			}

			// A decision recorded here ends the receipt: what arrives
			// again adds up (conservative).
			hit(to, 1)
			want++
			importKey(t, to.eng, newer)
			if got := used(t, to.eng, key); got < want {
				t.Fatalf("a version imported after a decision here: %d used; want at least %d", got, want)
			}
		})
	}
}

// TestImportAgainAfterEviction: a key that left memory between two
// imports of the same state has no receipt any more: the second adds up
// (over-counting, which only denies more), and nothing is lost.
func TestImportAgainAfterEviction(t *testing.T) {
	to := newHarness(t, "commit", func(c *Config) { c.Actors, c.MaxKeys = 1, 2 })
	from := newHarness(t, "commit", nil)
	to.hit("k", 100, 4)
	from.hit("k", 100, 5)
	x := collectKey(t, from.eng, "k")
	importKey(t, to.eng, x)
	for i := range 4 { // push k out of memory
		to.hit(fmt.Sprintf("other-%d", i), 100, 1)
	}
	to.settle()
	importKey(t, to.eng, x)
	if got := used(t, to.eng, "k"); got < 9 {
		t.Fatalf("after the key left memory and the state came again: %d used; want at least 9", got)
	}
}

// TestReimportCountsEachHitOnce checks reimport on random states: with
// prev of one lineage and old, o two copies of another history (one
// perhaps further along), merging old into prev and then reimporting o
// counts what merging the join of old and o into prev counts (each hit of
// the imported history once), reimporting old again changes nothing, and
// the result never counts less than before or than prev ⊕ o.
func TestReimportCountsEachHitOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		rng := rand.New(rand.NewPCG(uint64(algo), 21))
		tested := 0
		for i := range 4000 {
			maxRuns := 4 + rng.IntN(8)
			copies, now := lnCopies(rng, algo, 3, maxRuns, false)
			prev, old, o := copies[0], copies[1], copies[2]
			if old.lineage != o.lineage || !prev.valid() || prev.isEmpty(now) || !old.valid() || old.isEmpty(now) {
				continue
			}
			// prev counts hits of its own history (the same hits, here,
			// under another lineage: they add up).
			prev.lineage = newLineage()
			tested++
			what := func(law string) string { return fmt.Sprintf("%v case %d: %s", algo, i, law) }

			s := lnMerged(t, prev, old, now, maxRuns)
			before := s.clone()
			again := s.clone()
			again.reimport(now, &prev, &old, maxRuns)
			lnEqual(t, what("reimport(prev ⊕ old, old) = prev ⊕ old"), again, s, now, maxRuns)

			s.reimport(now, &prev, &o, maxRuns)
			want := lnMerged(t, prev, lnMerged(t, old, o, now, maxRuns), now, maxRuns)
			got, exp := s.usedAt(now), want.usedAt(now)
			if algo == SlidingLog {
				got, exp = min(got, s.limit+1), min(exp, s.limit+1)
			}
			// The counters round a weighted bucket or tokens: one apart.
			if got != exp && (algo == SlidingLog || got < exp-1 || got > exp+1) {
				t.Fatalf("%s: %d used; want %d\ngot %+v\nwant %+v", what("prev ⊕ old, then o"), got, exp, s, want)
			}
			if s.lineage != prev.lineage {
				t.Fatalf("%s: lineage %x; want the receiver's %x", what("lineage"), s.lineage, prev.lineage)
			}
			lnCovers(t, what("covers the state before"), s, before, now)
			lnCovers(t, what("covers prev ⊕ o"), s, lnMerged(t, prev, o, now, maxRuns), now)
		}
		if tested < 1000 {
			t.Errorf("%v: %d cases; want at least 1000", algo, tested)
		}
	}
}
