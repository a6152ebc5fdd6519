package actor

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// stored plays the store's part for one key: a full write replaces the
// value, a tail is appended to it, a deletion drops it (a tail after one is
// stored alone).
type stored struct{ value []byte }

// write persists s as the actor does: a tail when appendTail can, else the
// full encoding. It returns whether it wrote a tail and how many bytes.
func (st *stored) write(s *state, sv *saved, now int64) (tail bool, n int) {
	if b, ok := s.appendTail(nil, sv, now); ok {
		st.value = append(st.value, b...)
		return true, len(b)
	}
	b := s.appendBinary(nil)
	s.written(sv, len(b))
	st.value = b
	return false, len(b)
}

// sameAt reports whether a and b hold the same hits at now: the stored chain
// keeps runs that memory pruned, until they are shed by a full write.
func sameAt(a, b *state, now int64) bool {
	x, y := a.clone(), b.clone()
	if x.algo == SlidingLog {
		x.logPrune(now)
		y.logPrune(now)
	}
	return stSame(&x, &y)
}

// TestTailChain drives one key with random checks (new hits mostly, and now
// and then a refund, a penalty, a release, a new limit or window, another
// algorithm, a merge, an eviction and reload; only new hits for some seeds),
// writes it after every batch
// as the actor does, and checks that the stored value always decodes to the
// state in memory, and that tails keep the stored value within twice the
// last full write, plus 512 bytes.
func TestTailChain(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var s state
		var sv saved
		var disk stored
		var d Decision
		now := st0
		limit, window, algo := int64(50+rng.IntN(200)), int64(stSec), SlidingLog
		maxRuns := 20 + rng.IntN(300)
		calm := seed >= 30 // new hits only
		tails, fulls, tailBytes, lastFull := 0, 0, 0, 0
		for step := range 2000 {
			changed := false
			for range 1 + rng.IntN(4) { // one batch
				now += int64(rng.IntN(int(20 * stMs)))
				c := Check{Key: "k", Limit: limit, Window: time.Duration(window), Algorithm: algo, Cost: 1 + int64(rng.IntN(3))}
				r := rng.IntN(100)
				if calm {
					r = 100
				}
				switch {
				case r < 2:
					c.Refund = true
				case r < 4:
					c.Penalty = true
				case r < 5:
					c.Limit = int64(20 + rng.IntN(300))
					limit = c.Limit
				case r < 6:
					c.Window = time.Duration(stMs) * time.Duration(200+rng.IntN(2000))
					window = int64(c.Window)
				case r < 7 && seed%4 == 0:
					c.Algorithm = Algorithm(rng.IntN(3))
					algo = c.Algorithm
				case r < 8:
					s.decide(now, &c, maxRuns, &d)
					s.release(s.mark(), c.Cost)
					changed = true
					continue
				case r < 9:
					var o state
					o.decide(now, &Check{Key: "k", Limit: limit, Window: time.Duration(window), Algorithm: SlidingLog, Cost: 2}, maxRuns, &d)
					s.merge(now, &o, maxRuns)
					changed = true
					continue
				}
				changed = s.decide(now, &c, maxRuns, &d) || changed
			}
			if !changed {
				continue // the actor writes only what changed
			}
			if s.isEmpty(now) {
				disk.value, sv = nil, saved{} // the actor deletes it
				continue
			}
			tail, n := disk.write(&s, &sv, now)
			if tail {
				tails, tailBytes = tails+1, tailBytes+n
			} else {
				fulls, lastFull = fulls+1, n
			}
			var u state
			if err := u.decode(disk.value); err != nil {
				t.Fatalf("seed %d step %d: decode(stored) = %v", seed, step, err)
			}
			if !sameAt(&s, &u, now) {
				t.Fatalf("seed %d step %d: stored %+v; memory %+v", seed, step, u.appendEntries(nil), s.appendEntries(nil))
			}
			if len(disk.value) > 2*lastFull+512 {
				t.Fatalf("seed %d step %d: stored value of %d bytes after a full write of %d", seed, step, len(disk.value), lastFull)
			}
			if rng.IntN(200) == 0 { // evicted, then loaded again
				s, sv = u, saved{}
			}
		}
		if algo == SlidingLog && tails == 0 {
			t.Errorf("seed %d: no tail was written (%d full writes)", seed, fulls)
		}
		if calm && tails < 8*fulls {
			t.Errorf("seed %d, new hits only: %d tails and %d full writes; want mostly tails", seed, tails, fulls)
		}
		if seed == 0 || seed == 30 {
			t.Logf("seed %d: %d tails of %.0f bytes on average, %d full writes", seed, tails, float64(tailBytes)/float64(max(tails, 1)), fulls)
		}
	}
}

// TestTailAlone checks that a tail whose full segment was deleted (the store
// keeps it alone) decodes to the hits it holds.
func TestTailAlone(t *testing.T) {
	var s state
	var sv saved
	var d Decision
	c := Check{Key: "k", Limit: 10, Window: stSec, Cost: 1}
	s.decide(st0, &c, 100, &d)
	s.written(&sv, len(s.appendBinary(nil)))
	s.decide(st0+int64(stMs), &c, 100, &d)
	s.decide(st0+2*int64(stMs), &c, 100, &d)
	tail, ok := s.appendTail(nil, &sv, st0+2*int64(stMs))
	if !ok {
		t.Fatal("appendTail: no tail")
	}
	var u state
	if err := u.decode(tail); err != nil {
		t.Fatal(err)
	}
	want := []run{{st0 + int64(stMs), 1}, {st0 + 2*int64(stMs), 1}}
	if got := u.appendEntries(nil); !slices.Equal(got, want) || u.limit != 10 || u.window != int64(stSec) {
		t.Fatalf("decode(tail) = %+v, limit %d, window %d; want %+v", got, u.limit, u.window, want)
	}
}
