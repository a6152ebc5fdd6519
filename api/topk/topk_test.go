package topk

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// zipfStream returns n keys drawn from a Zipf distribution (exponent s) over
// keys distinct keys: skewed traffic, a few keys hot and a long tail.
func zipfStream(n, keys int, s float64, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, seed))
	z := rand.NewZipf(r, s, 1, uint64(keys-1))
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("tenant:%d", i)
	}
	out := make([]string, n)
	for i := range out {
		out[i] = names[z.Uint64()]
	}
	return out
}

func exactCounts(stream []string) map[string]uint64 {
	m := make(map[string]uint64)
	for _, k := range stream {
		m[k]++
	}
	return m
}

// checkBounds checks the guarantee of a summary against the exact counts:
// every listed key's true count is in [Count−Err, Count], every other key's
// is at most Floor, and the error is at most limit.
func checkBounds(t *testing.T, name string, sum Summary, exact map[string]uint64, limit uint64) {
	t.Helper()
	listed := make(map[string]bool)
	var total uint64
	for _, n := range exact {
		total += n
	}
	if sum.Total != total {
		t.Errorf("%s: Total = %d; want %d", name, sum.Total, total)
	}
	for _, e := range sum.Entries {
		listed[e.Key] = true
		if got := exact[e.Key]; got > e.Count || got < e.Count-e.Err {
			t.Errorf("%s: %s: count %d ± %d, but it was counted %d times", name, e.Key, e.Count, e.Err, got)
		}
		if e.Err > limit {
			t.Errorf("%s: %s: error %d; want at most %d", name, e.Key, e.Err, limit)
		}
	}
	if sum.Floor > limit {
		t.Errorf("%s: Floor = %d; want at most %d", name, sum.Floor, limit)
	}
	for k, n := range exact {
		if !listed[k] && n > sum.Floor {
			t.Errorf("%s: %s was counted %d times, above Floor %d, and is not listed", name, k, n, sum.Floor)
		}
	}
}

// topExact returns the n keys counted most, largest first (ties by key).
func topExact(exact map[string]uint64, n int) []Entry {
	s := Summary{}
	for k, c := range exact {
		s.Entries = append(s.Entries, Entry{Key: k, Count: c})
	}
	s.sort()
	return s.Truncate(n).Entries
}

// TestSketchSkewed: on skewed traffic (Zipf over 10,000 keys), a sketch of
// 128 counters bounds every key's count, never undercounts, errs by at
// most N/128, and lists the ten keys counted most in their exact order.
func TestSketchSkewed(t *testing.T) {
	for _, s := range []float64{1.1, 1.5} {
		t.Run(fmt.Sprintf("zipf %.1f", s), func(t *testing.T) {
			stream := zipfStream(200_000, 10_000, s, 7)
			exact := exactCounts(stream)
			sk := New(128)
			for _, k := range stream {
				sk.Add(k, 1)
			}
			sum := sk.Summary()
			limit := uint64(len(stream)) / 128
			checkBounds(t, "sketch", sum, exact, limit)
			want := topExact(exact, 10)
			for i, w := range want {
				if got := sum.Entries[i]; got.Key != w.Key {
					t.Errorf("top %d = %s (%d ± %d); want %s (%d)", i+1, got.Key, got.Count, got.Err, w.Key, w.Count)
				}
			}
			var worst uint64
			for _, e := range sum.Truncate(10).Entries {
				worst = max(worst, e.Count-exact[e.Key])
			}
			t.Logf("N=%d, bound N/k=%d, floor=%d, largest overcount in the top 10: %d", len(stream), limit, sum.Floor, worst)
		})
	}
}

// TestSketchExactUnderCapacity: with no more keys than counters, counts are
// exact and Floor is 0.
func TestSketchExactUnderCapacity(t *testing.T) {
	sk := New(4)
	for i, k := range []string{"a", "b", "a", "c", "a", "b"} {
		sk.Add(k, uint64(i%2+1))
	}
	got := sk.Summary()
	want := []Entry{{"b", 4, 0}, {"a", 3, 0}, {"c", 2, 0}}
	if fmt.Sprint(got.Entries) != fmt.Sprint(want) || got.Floor != 0 || got.Total != 9 {
		t.Errorf("Summary() = %+v; want entries %v, floor 0, total 9", got, want)
	}
	sk.Reset()
	if got := sk.Summary(); len(got.Entries) != 0 || got.Total != 0 {
		t.Errorf("Summary() after Reset = %+v; want empty", got)
	}
}

// TestMerge: summaries of a stream split any way (by key, or at random, as
// stripes and nodes split it) merge into one whose bounds hold for the
// whole stream, with an error at most N/k; so does the merged summary
// truncated to its top 20.
func TestMerge(t *testing.T) {
	stream := zipfStream(100_000, 5_000, 1.2, 11)
	exact := exactCounts(stream)
	const parts, capacity = 4, 64
	r := rand.New(rand.NewPCG(3, 3))
	for _, split := range []string{"random", "by key"} {
		t.Run(split, func(t *testing.T) {
			sketches := make([]*Sketch, parts)
			for i := range sketches {
				sketches[i] = New(capacity)
			}
			for _, k := range stream {
				i := r.IntN(parts)
				if split == "by key" {
					i = int(k[len(k)-1]) % parts
				}
				sketches[i].Add(k, 1)
			}
			sums := make([]Summary, parts)
			for i, sk := range sketches {
				sums[i] = sk.Summary()
			}
			merged := Merge(sums...)
			limit := uint64(len(stream)) / capacity
			checkBounds(t, "merged", merged, exact, limit)
			checkBounds(t, "merged top 20", merged.Truncate(20), exact, limit)
			// Merging truncated summaries (as a node merges its peers' top
			// lists) keeps the bounds too.
			for i := range sums {
				sums[i] = sums[i].Truncate(20)
			}
			checkBounds(t, "merged of top 20s", Merge(sums...), exact, limit)
			if got, want := merged.Entries[0].Key, topExact(exact, 1)[0].Key; got != want {
				t.Errorf("merged top key = %s; want %s", got, want)
			}
		})
	}
}

// TestWeighted: weights count as that many hits.
func TestWeighted(t *testing.T) {
	sk := New(2)
	sk.Add("a", 5)
	sk.Add("b", 3)
	sk.Add("c", 1) // takes over b: 3+1, error 3
	got := sk.Summary()
	want := []Entry{{"a", 5, 0}, {"c", 4, 3}}
	if fmt.Sprint(got.Entries) != fmt.Sprint(want) || got.Floor != 4 {
		t.Errorf("Summary() = %+v; want entries %v, floor 4", got, want)
	}
}

func BenchmarkAdd(b *testing.B) {
	stream := zipfStream(1<<16, 100_000, 1.1, 5)
	sk := New(128)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		sk.Add(stream[i&(1<<16-1)], 1)
	}
}
