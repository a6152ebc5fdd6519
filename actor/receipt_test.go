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

// dayHits returns a function that records cost hits of key on a
// harness, in algo, limit 100 per day: what a bucket refills in the
// seconds a test waits is below one hit.
func dayHits(t *testing.T, key string, algo Algorithm) func(h *harness, cost int64) {
	return func(h *harness, cost int64) {
		t.Helper()
		h.check(Check{Key: key, Limit: 100, Window: 24 * time.Hour, Algorithm: algo, Cost: cost})
	}
}

// TestImportAgainCountsOnce: a handed-over state that arrives twice (the
// sender retried a handoff whose answer it did not get, after the
// receiver committed it), or a newer version of it (the sender's state
// changed after it was read), is counted once on a receiver that holds
// hits of its own, of another lineage, for every algorithm, in memory and
// after the key left memory, and while this node records hits of its own
// between the imports (it decides the key while the sender retries a part
// whose answer was lost).
func TestImportAgainCountsOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			const key = "k"
			hit := dayHits(t, key, algo)
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

			// Hits recorded here between two imports are the key's own:
			// the next version of the sender's state adds only what it
			// holds beyond the versions taken in.
			hit(to, 1)
			want++
			importKey(t, to.eng, newer)
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("the same version imported after a decision here: %d used; want %d", got, want)
			}
			to.clk.Advance(time.Second)
			from.clk.Advance(time.Second)
			hit(from, 4)
			newest := collectKey(t, from.eng, key)
			hit(to, 2)
			want += 4 + 2
			importKey(t, to.eng, newest)
			importKey(t, to.eng, newer)
			importKey(t, to.eng, newest)
			if got := used(t, to.eng, key); got != want {
				t.Fatalf("decisions here and newer versions in turn: %d used; want %d", got, want)
			}

			// A reset ends the receipts: the key holds nothing, and what
			// arrives then is all there is.
			if _, err := to.eng.Reset(context.Background(), key); err != nil {
				t.Fatal(err)
			}
			importKey(t, to.eng, newest)
			if got, want := used(t, to.eng, key), int64(3+2+4); got != want {
				t.Fatalf("after a reset, the sender's state imported: %d used; want %d", got, want)
			}
		})
	}
}

// TestHandedBackCountsOnce: a node hands its state of a key over and
// keeps it, not knowing it was delivered (the answer was lost); the
// receiver adds it up with hits of its own, records more, and hands the
// key back. Split by history, what comes back joins with the copy the
// first node kept: each hit once, for every algorithm. A node that holds
// neither history counts what the receiver counted.
func TestHandedBackCountsOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		t.Run(algo.String(), func(t *testing.T) {
			const key = "k"
			hit := dayHits(t, key, algo)
			first := newHarness(t, "commit", nil)
			second := newHarness(t, "commit", nil)
			third := newHarness(t, "commit", nil)
			hit(first, 3)
			sent := collectKey(t, first.eng, key) // delivered; the first node keeps it
			hit(second, 5)
			importKey(t, second.eng, sent)
			second.clk.Advance(time.Second)
			hit(second, 1)
			back := collectKey(t, second.eng, key)
			if len(back.Parts) != 2 {
				t.Fatalf("the state handed back has %d parts; want 2 (the receiver's own hits, then the history it took in)", len(back.Parts))
			}
			for _, x := range back.Split() {
				importKey(t, first.eng, x)
			}
			if got, want := used(t, first.eng, key), int64(3+5+1); got != want {
				t.Fatalf("handed back to the node that kept its copy: %d used; want %d", got, want)
			}
			for _, x := range back.Split() {
				importKey(t, third.eng, x)
			}
			if got, want := used(t, third.eng, key), int64(3+5+1); got != want {
				t.Fatalf("handed to a node that held nothing: %d used; want %d", got, want)
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

// TestExcessCountsEachHitOnce checks the receipts' rule on random states:
// with prev of one lineage, old and o two copies of another history (one
// perhaps further along, or each with hits the other lacks), and own hits
// the receiver recorded after it took old in, adding up prev ⊕ old ⊕ own
// with o's excess over old counts what prev ⊕ join(old, o) ⊕ own counts
// (each hit of the imported history once), old's excess over itself is
// nothing, and the result never counts less than before or than prev ⊕ o.
func TestExcessCountsEachHitOnce(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		rng := rand.New(rand.NewPCG(uint64(algo), 21))
		tested := 0
		for i := range 6000 {
			maxRuns := 4 + rng.IntN(8)
			copies, now := lnCopies(rng, algo, 4, maxRuns, false)
			prev, old, o, own := copies[0], copies[1], copies[2], copies[3]
			if old.lineage != o.lineage || !prev.valid() || prev.isEmpty(now) || !old.valid() || old.isEmpty(now) {
				continue
			}
			// prev and own count hits of the receiver's history (the same
			// hits, here, under other lineages: they add up).
			prev.lineage, own.lineage = newLineage(), newLineage()
			tested++
			what := func(law string) string { return fmt.Sprintf("%v case %d: %s", algo, i, law) }

			s := lnMerged(t, prev, old, now, maxRuns)
			if rng.IntN(2) == 0 && own.valid() {
				s = lnMerged(t, s, own, now, maxRuns)
				prev = lnMerged(t, prev, own, now, maxRuns)
			}
			before := s.clone()
			if e := old.excess(now, &old, maxRuns); e.valid() {
				t.Fatalf("%s: %+v", what("old holds nothing beyond old"), e)
			}

			e := o.excess(now, &old, maxRuns)
			s.merge(now, &e, maxRuns)
			want := lnMerged(t, prev, lnMerged(t, old, o, now, maxRuns), now, maxRuns)
			got, exp := s.usedAt(now), want.usedAt(now)
			if algo == SlidingLog {
				got, exp = min(got, s.limit+1), min(exp, s.limit+1)
			}
			// The counters round a weighted bucket or tokens: one apart.
			if got != exp && (algo == SlidingLog || got < exp-1 || got > exp+1) {
				t.Fatalf("%s: %d used; want %d\ngot %+v\nwant %+v", what("prev ⊕ old, then o's excess"), got, exp, s, want)
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

// TestReceiptsExpire: a receipt is kept no longer than it can matter:
// until what it took in has expired, and all of a key's receipts until
// the key holds nothing.
func TestReceiptsExpire(t *testing.T) {
	now := int64(time.Hour)
	hit := func(at int64, window time.Duration) state {
		var s state
		s.reset(at, SlidingLog, 10, int64(window))
		s.logAdd(at, 1, 64)
		s.lineage = newLineage()
		return s
	}
	ent := &entry{key: "k", st: hit(now-int64(time.Minute), time.Hour)}
	gone := &receipt{in: hit(now-2*int64(time.Minute), time.Minute)}
	live := &receipt{in: hit(now-10*int64(time.Second), time.Minute)}
	a := &actor{receipts: map[string][]*receipt{"k": {gone, live}}}

	a.expireReceipts(ent, now)
	if rs := a.receipts["k"]; len(rs) != 1 || rs[0] != live {
		t.Fatalf("receipts after the first one's hits expired: %v; want only the live one", rs)
	}
	a.expireReceipts(ent, now+int64(time.Hour))
	if rs, ok := a.receipts["k"]; ok {
		t.Fatalf("receipts of a key that holds nothing: %v; want none", rs)
	}
}
