package actor

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// lnCheck is a random check of stTraffic's kind on one key: mostly small
// costs, some refunds and penalties.
func lnCheck(rng *rand.Rand, algo Algorithm, limit, window int64) Check {
	c := Check{Key: "k", Limit: limit, Window: time.Duration(window), Algorithm: algo, Cost: 1 + rng.Int64N(min(limit, 3))}
	switch rng.IntN(12) {
	case 0:
		c.Refund = true
	case 1, 2:
		c.Penalty = true
	case 3:
		c.Cost = 0
	}
	return c
}

// lnRun applies n random checks to s from now on, each after a random gap
// (often none, sometimes more than the window; with jitter, now and then
// back in time) and returns the latest time of a check.
func lnRun(rng *rand.Rand, s *state, now int64, n int, algo Algorithm, limit, window int64, maxRuns int, jitter bool) int64 {
	var d Decision
	latest := now
	for range n {
		switch rng.IntN(8) {
		case 0:
			if jitter {
				now -= rng.Int64N(window)
			}
		case 1:
			now += rng.Int64N(2 * window)
		default:
			now += rng.Int64N(max(1, window/limit))
		}
		c := lnCheck(rng, algo, limit, window)
		s.decide(now, &c, maxRuns, &d)
		latest = max(latest, now)
	}
	return latest
}

// lnCopies returns n copies of one random history of algorithm algo: a
// state built by random checks, then each copy taken further by its own
// random checks (a standby that missed the owner's last writes, an owner
// whose last writes were not replicated, a standby that took over), and a
// time at or after every copy's last check (with jitter, the checks of a
// copy may go back in time, and the time returned may be before some).
func lnCopies(rng *rand.Rand, algo Algorithm, n int, maxRuns int, jitter bool) ([]state, int64) {
	limit := 1 + rng.Int64N(12)
	if rng.IntN(4) == 0 {
		limit = int64(maxRuns) + 1 + rng.Int64N(40) // rounded timestamps
	}
	window := int64(stMs) * (1 + rng.Int64N(200))
	var base state
	now := lnRun(rng, &base, st0, 1+rng.IntN(30), algo, limit, window, maxRuns, jitter)
	copies := make([]state, n)
	latest := now
	for i := range copies {
		copies[i] = base.clone()
		if rng.IntN(4) > 0 {
			latest = max(latest, lnRun(rng, &copies[i], now, rng.IntN(8), algo, limit, window, maxRuns, jitter))
		}
	}
	if jitter {
		return copies, latest - rng.Int64N(window/2+1)
	}
	return copies, latest + rng.Int64N(window/2+1)
}

// lnCanon returns s as it stands at now: a peek brings it to now (expired
// runs pruned, buckets moved, tokens refilled), and a log keeps its newest
// limit+1 hits (which decide no differently than more). A state that holds
// nothing at now is the zero state.
func lnCanon(s *state, now int64, maxRuns int) state {
	if !s.valid() || s.isEmpty(now) {
		return state{}
	}
	c := s.clone()
	var d Decision
	c.decide(now, &Check{Key: "k", Limit: c.limit, Window: time.Duration(c.window), Algorithm: c.algo}, maxRuns, &d)
	if c.algo == SlidingLog && c.cur > c.limit+1 {
		c.logTrim(c.limit + 1)
	}
	c.buf = c.appendEntries(nil)
	c.head, c.rewrite = 0, false
	return c
}

// lnMerged returns a copy of s with o merged into it at now.
func lnMerged(t *testing.T, s, o state, now int64, maxRuns int) state {
	t.Helper()
	r := s.clone()
	mgMerge(t, &r, now, &o, maxRuns)
	return r
}

// lnEqual fails t unless a and b hold the same state at now.
func lnEqual(t *testing.T, what string, a, b state, now int64, maxRuns int) {
	t.Helper()
	x, y := lnCanon(&a, now, maxRuns), lnCanon(&b, now, maxRuns)
	if !stSame(&x, &y) {
		t.Fatalf("%s: %+v (%v)\nwant %+v (%v)", what, x, x.appendEntries(nil), y, y.appendEntries(nil))
	}
}

// lnCovers fails t unless r counts at least what s counts at every time
// from now on (the log up to limit+1 hits, beyond which nothing is decided
// differently).
func lnCovers(t *testing.T, what string, r, s state, now int64) {
	t.Helper()
	if !s.valid() {
		return
	}
	capped := func(x *state, at int64) int64 {
		u := x.usedAt(at)
		if x.algo == SlidingLog {
			u = min(u, x.limit+1)
		}
		return u
	}
	for at := now; at <= now+2*s.window+1; at += max(1, s.window/16) {
		if got, want := capped(&r, at), capped(&s, at); got < want {
			t.Fatalf("%s: merged state counts %d at now+%v; a side counts %d\nmerged %+v %v\nside %+v %v", what, got, time.Duration(at-now), want, r, r.appendEntries(nil), s, s.appendEntries(nil))
		}
	}
}

// TestJoinLaws checks, on random copies of one history of every algorithm,
// that merging copies of the same lineage is a join: merge(a, a) = a,
// merge(a, b) = merge(b, a), merge(merge(a, b), c) = merge(a, merge(b, c))
// (as states at the merge's time), and the result counts, at every later
// time, at least what each copy counts.
func TestJoinLaws(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		rng := rand.New(rand.NewPCG(uint64(algo), 11))
		tested := 0
		for i := range 3000 {
			maxRuns := 4 + rng.IntN(8)
			copies, now := lnCopies(rng, algo, 3, maxRuns, false)
			a, b, c := copies[0], copies[1], copies[2]
			if a.lineage != b.lineage || b.lineage != c.lineage {
				continue // a copy emptied and started again: another history
			}
			tested++
			what := func(law string) string { return fmt.Sprintf("%v case %d: %s", algo, i, law) }
			lnEqual(t, what("merge(a, a) = a"), lnMerged(t, a, a, now, maxRuns), a, now, maxRuns)
			ab := lnMerged(t, a, b, now, maxRuns)
			lnEqual(t, what("merge(a, b) = merge(b, a)"), ab, lnMerged(t, b, a, now, maxRuns), now, maxRuns)
			lnEqual(t, what("merge(merge(a, b), b) = merge(a, b)"), lnMerged(t, ab, b, now, maxRuns), ab, now, maxRuns)
			lnEqual(t, what("merge(merge(a, b), c) = merge(a, merge(b, c))"),
				lnMerged(t, ab, c, now, maxRuns), lnMerged(t, a, lnMerged(t, b, c, now, maxRuns), now, maxRuns), now, maxRuns)
			lnCovers(t, what("merge(a, b) covers a"), ab, a, now)
			lnCovers(t, what("merge(a, b) covers b"), ab, b, now)
			if ab.valid() && !ab.isEmpty(now) && ab.lineage != a.lineage {
				t.Fatalf("%s: lineage %x; want the copies' %x", what("lineage"), ab.lineage, a.lineage)
			}
		}
		if tested < 1000 {
			t.Errorf("%v: %d cases of three copies of one lineage; want at least 1000", algo, tested)
		}
	}
}

// TestJoinClockBack checks copies of one history whose checks went back in
// time now and then (another node's clock, an NTP step), merged at a time
// before some of their hits: merging is still idempotent and commutative
// and counts what each copy counts. (Associativity holds only for states
// not ahead of the merge's time: a bucket ahead of now takes the other
// side's estimate, which depends on what was merged into it first.)
func TestJoinClockBack(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		rng := rand.New(rand.NewPCG(uint64(algo), 14))
		for i := range 3000 {
			maxRuns := 4 + rng.IntN(8)
			copies, now := lnCopies(rng, algo, 2, maxRuns, true)
			a, b := copies[0], copies[1]
			if a.lineage != b.lineage {
				continue
			}
			what := func(law string) string { return fmt.Sprintf("%v case %d: %s", algo, i, law) }
			lnEqual(t, what("merge(a, a) = a"), lnMerged(t, a, a, now, maxRuns), a, now, maxRuns)
			ab := lnMerged(t, a, b, now, maxRuns)
			lnEqual(t, what("merge(a, b) = merge(b, a)"), ab, lnMerged(t, b, a, now, maxRuns), now, maxRuns)
			lnCovers(t, what("merge(a, b) covers a"), ab, a, now)
			lnCovers(t, what("merge(a, b) covers b"), ab, b, now)
		}
	}
}

// TestJoinAcrossParameters checks copies of one history that differ in
// algorithm, limit or window (one missed a change): the merge is
// idempotent and commutative, and counts at the merge's time at least what
// each side counts there (with the same limit and window).
func TestJoinAcrossParameters(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 12))
	algos := []Algorithm{SlidingLog, SlidingWindow, TokenBucket}
	for i := range 3000 {
		maxRuns := 4 + rng.IntN(8)
		copies, now := lnCopies(rng, algos[rng.IntN(3)], 2, maxRuns, false)
		a, b := copies[0], copies[1]
		// b saw a check that brought another algorithm, or limit, or window.
		nb := b.clone()
		limit, window, algo := nb.limit, nb.window, nb.algo
		if limit == 0 {
			continue
		}
		sameParams := rng.IntN(2) == 0
		switch rng.IntN(3) {
		case 0:
			algo = algos[rng.IntN(3)]
		case 1:
			limit = 1 + rng.Int64N(12)
			sameParams = false
		default:
			window = int64(stMs) * (1 + rng.Int64N(200))
			sameParams = false
		}
		at := lnRun(rng, &nb, now, 1+rng.IntN(3), algo, limit, window, maxRuns, false)
		now = at + rng.Int64N(window/2+1)
		b = nb
		if a.lineage != b.lineage {
			continue // b emptied and started again: another history
		}
		what := func(law string) string { return fmt.Sprintf("case %d: %s", i, law) }
		lnEqual(t, what("merge(b, b) = b"), lnMerged(t, b, b, now, maxRuns), b, now, maxRuns)
		ab := lnMerged(t, a, b, now, maxRuns)
		lnEqual(t, what("merge(a, b) = merge(b, a)"), ab, lnMerged(t, b, a, now, maxRuns), now, maxRuns)
		if sameParams && ab.valid() && a.limit == ab.limit && b.limit == ab.limit {
			for _, x := range []*state{&a, &b} {
				if !x.valid() {
					continue
				}
				got, want := ab.usedAt(now), x.usedAt(now)
				if ab.algo != SlidingLog || x.algo != SlidingLog {
					// A bucket holds at most limit; a log keeps limit+1.
					got, want = min(got, ab.limit), min(want, ab.limit)
				} else {
					got, want = min(got, ab.limit+1), min(want, ab.limit+1)
				}
				if got < want {
					t.Fatalf("%s: merged %v counts %d at now; %v side counts %d", what("covers"), ab.algo, got, x.algo, want)
				}
			}
		}
	}
}

// TestMergeDifferentLineagesAddUp checks that states of different (or
// unknown) lineages still add up, as before lineages, and which lineage the
// result keeps: the receiver's, else the other's.
func TestMergeDifferentLineagesAddUp(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		rng := rand.New(rand.NewPCG(uint64(algo), 13))
		for i := range 2000 {
			maxRuns := 1000
			a, now := lnCopies(rng, algo, 1, maxRuns, false)
			s := a[0]
			if !s.valid() || s.isEmpty(now) {
				continue
			}
			// The same hits, counted by another history.
			o := s.clone()
			o.lineage = newLineage()
			if rng.IntN(3) == 0 {
				s.lineage = 0
			}
			r := lnMerged(t, s, o, now, maxRuns)
			got, want := r.usedAt(now), s.usedAt(now)+o.usedAt(now)
			switch algo {
			case SlidingLog:
				want = min(want, s.limit+1)
			case TokenBucket:
				want = min(want, s.limit)
			}
			// The log adds up exactly; the counters round each side's
			// weighted previous bucket or tokens, so the sum may count one
			// less than the two apart.
			if got > want || got < want-1 || algo == SlidingLog && got != want {
				t.Fatalf("%v case %d: %d hits merged into %d of another lineage: %d used; want %d", algo, i, o.usedAt(now), s.usedAt(now), got, want)
			}
			wantLineage := s.lineage
			if wantLineage == 0 {
				wantLineage = o.lineage
			}
			if r.lineage != wantLineage {
				t.Fatalf("%v case %d: merged lineage %x; want %x (receiver %x, other %x)", algo, i, r.lineage, wantLineage, s.lineage, o.lineage)
			}
		}
	}
}

// TestLineageLife checks when a state's lineage is drawn and that it is
// kept: drawn on the first hit, kept through hits, refunds, a new limit, a
// new window, another algorithm, a release and an encoding round trip,
// drawn again once the state emptied and takes hits again, and drawn for a
// state of unknown lineage at its next change, which is then written in
// full.
func TestLineageLife(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		var s state
		var d Decision
		c := Check{Key: "k", Limit: 10, Window: stSec, Algorithm: algo}
		s.decide(st0, &c, stMaxRuns, &d) // a peek records nothing
		if s.lineage != 0 {
			t.Errorf("%v: a peek on a new key drew lineage %x; want none", algo, s.lineage)
		}
		c.Cost = 2
		s.decide(st0, &c, stMaxRuns, &d)
		first := s.lineage
		if first == 0 {
			t.Fatalf("%v: no lineage after a first hit", algo)
		}
		steps := []struct {
			name string
			at   time.Duration
			c    Check
		}{
			{"a hit", stMs, Check{Limit: 10, Window: stSec, Algorithm: algo, Cost: 1}},
			{"a refund", 2 * stMs, Check{Limit: 10, Window: stSec, Algorithm: algo, Cost: 1, Refund: true}},
			{"a new limit", 3 * stMs, Check{Limit: 20, Window: stSec, Algorithm: algo, Cost: 1}},
			{"a new window", 4 * stMs, Check{Limit: 20, Window: 2 * stSec, Algorithm: algo, Cost: 1}},
			{"another algorithm", 5 * stMs, Check{Limit: 20, Window: 2 * stSec, Algorithm: (algo + 1) % numAlgorithms, Cost: 1}},
			{"the algorithm back", 6 * stMs, Check{Limit: 20, Window: 2 * stSec, Algorithm: algo, Cost: 1}},
		}
		for _, st := range steps {
			st.c.Key = "k"
			s.decide(st0+int64(st.at), &st.c, stMaxRuns, &d)
			if s.lineage != first {
				t.Fatalf("%v: after %s lineage %x; want %x", algo, st.name, s.lineage, first)
			}
		}
		s.release(s.mark(), 1)
		var u state
		if err := u.decode(s.appendBinary(nil)); err != nil || u.lineage != first {
			t.Fatalf("%v: decode(appendBinary) lineage %x, %v; want %x", algo, u.lineage, err, first)
		}
		// Emptied, then a hit: a new history.
		later := st0 + int64(time.Hour)
		c = Check{Key: "k", Limit: 20, Window: 2 * stSec, Algorithm: algo, Cost: 1}
		s.decide(later, &c, stMaxRuns, &d)
		if s.lineage == 0 || s.lineage == first {
			t.Errorf("%v: a hit after the state emptied kept lineage %x (first %x); want a new one", algo, s.lineage, first)
		}
		// Unknown lineage (written before lineages): drawn at the next
		// change, and the next write is a full one.
		s.lineage = 0
		s.rewrite = false
		c.Cost = 0
		s.decide(later+1, &c, stMaxRuns, &d)
		if s.lineage != 0 {
			t.Errorf("%v: a peek drew lineage %x for a state of unknown lineage; want none", algo, s.lineage)
		}
		c.Cost = 1
		s.decide(later+2, &c, stMaxRuns, &d)
		if s.lineage == 0 || !s.rewrite {
			t.Errorf("%v: a hit on a state of unknown lineage: lineage %x, rewrite %v; want a new lineage and a full write", algo, s.lineage, s.rewrite)
		}
	}
}

// TestLineageEncoding checks the encodings: a full segment of version 3
// carries the lineage; one of version 1 (written before lineages) decodes
// with lineage 0 and is written again as version 1; a chain keeps its full
// segment's lineage; a tail alone has lineage 0.
func TestLineageEncoding(t *testing.T) {
	var s state
	var sv saved
	var d Decision
	c := Check{Key: "k", Limit: 100, Window: stSec, Cost: 1}
	s.decide(st0, &c, stMaxRuns, &d)
	full := s.appendBinary(nil)
	s.written(&sv, len(full))
	if full[0] != lineageVersion || binary.LittleEndian.Uint64(full[2:]) != s.lineage {
		t.Fatalf("full segment %x; want version %d and lineage %x", full, lineageVersion, s.lineage)
	}
	s.decide(st0+1, &c, stMaxRuns, &d)
	tail, ok := s.appendTail(nil, &sv, st0+1)
	if !ok {
		t.Fatal("no tail after a new hit")
	}
	var u state
	if err := u.decode(append(full, tail...)); err != nil || u.lineage != s.lineage || u.cur != 2 {
		t.Fatalf("decode(chain) = %+v, %v; want 2 hits of lineage %x", u, err, s.lineage)
	}
	if err := u.decode(tail); err != nil || u.lineage != 0 || u.cur != 1 {
		t.Fatalf("decode(tail alone) = %+v, %v; want 1 hit of lineage 0", u, err)
	}
	// Version 1: the same without the lineage.
	v1 := append([]byte{stateVersion, full[1]}, full[10:]...)
	if err := u.decode(v1); err != nil || u.lineage != 0 || u.cur != 1 {
		t.Fatalf("decode(version 1) = %+v, %v; want 1 hit of lineage 0", u, err)
	}
	if got := u.appendBinary(nil); string(got) != string(v1) {
		t.Fatalf("version 1 re-encoded as %x; want %x", got, v1)
	}
	if len(full) != len(v1)+8 {
		t.Errorf("a lineage costs %d bytes; want 8", len(full)-len(v1))
	}
}
