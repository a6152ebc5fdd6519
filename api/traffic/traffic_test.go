package traffic

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newRecorder(t testing.TB, cfg Config) *Recorder {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSnapshot: the top keys, per-second counts and latency of what was
// recorded, read back.
func TestSnapshot(t *testing.T) {
	r := newRecorder(t, Config{})
	now := t0.Add(3 * time.Second) // 3 s into a bucket
	for i := range 10 {
		r.Decided(now, "hot", i >= 7)
	}
	r.Decided(now, "cold", false)
	r.Decided(now.Add(-time.Second), "cold", true)
	for i := range 100 {
		r.Answered(now, 0, time.Duration(i+1)*time.Millisecond)
	}
	r.Answered(now, 2, time.Millisecond)
	s := r.Snapshot(now, 10, 3)
	if got, want := s.Window, 53*time.Second; got != want {
		t.Errorf("Window = %v; want %v (five whole buckets and 3 s)", got, want)
	}
	if got := fmt.Sprint(s.Decisions.Entries); got != "[{hot 10 0} {cold 2 0}]" {
		t.Errorf("Decisions = %s; want hot 10, cold 2, exact", got)
	}
	if got := fmt.Sprint(s.Denials.Entries); got != "[{hot 3 0} {cold 1 0}]" {
		t.Errorf("Denials = %s; want hot 3, cold 1, exact", got)
	}
	want := []Second{
		{Unix: now.Unix() - 2},
		{Unix: now.Unix() - 1, Decisions: 1, Denials: 1},
		{Unix: now.Unix(), Decisions: 11, Denials: 3, Errors: 2, Requests: 101},
	}
	if fmt.Sprint(s.Seconds) != fmt.Sprint(want) {
		t.Errorf("Seconds = %+v; want %+v", s.Seconds, want)
	}
	l := s.Latency
	if l.Requests != 101 || l.Max != 100*time.Millisecond ||
		l.P50 < 50*time.Millisecond || l.P50 > 63*time.Millisecond ||
		l.P99 < 99*time.Millisecond || l.P99 > 100*time.Millisecond {
		t.Errorf("Latency = %+v; want 101 requests, p50 in [50ms, 62.5ms], p99 in [99ms, 100ms], max 100ms", l)
	}
}

// TestOldCountsLeave: counts older than the window leave the snapshot, and
// a slot the clock comes back to starts from zero.
func TestOldCountsLeave(t *testing.T) {
	r := newRecorder(t, Config{Seconds: 10})
	r.Decided(t0, "old", true)
	r.Answered(t0, 1, time.Second)
	later := t0.Add(time.Minute)
	r.Decided(later, "new", false)
	s := r.Snapshot(later, 10, 10)
	if got := fmt.Sprint(s.Decisions.Entries); got != "[{new 1 0}]" || len(s.Denials.Entries) != 0 || s.Latency.Requests != 0 {
		t.Errorf("a minute later: Decisions = %s, Denials = %v, Latency = %+v; want only new, no denials, no requests", got, s.Denials.Entries, s.Latency)
	}
	var total uint64
	for _, sec := range s.Seconds {
		total += sec.Decisions + sec.Errors
	}
	if total != 1 {
		t.Errorf("Seconds a minute later = %+v; want the one decision of the last second", s.Seconds)
	}
}

// TestConcurrentBounds: decisions recorded from many goroutines on skewed
// traffic are all counted (Total), and each key's count holds the sketch's
// bounds against the exact counts, whichever stripes took it.
func TestConcurrentBounds(t *testing.T) {
	r := newRecorder(t, Config{Stripes: 4, Capacity: 32})
	const workers, per = 8, 5000
	keys := make([][]string, workers)
	for w := range keys {
		rng := rand.New(rand.NewPCG(uint64(w), 1))
		z := rand.NewZipf(rng, 1.2, 1, 2000)
		for range per {
			keys[w] = append(keys[w], fmt.Sprintf("k%d", z.Uint64()))
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i, k := range keys[w] {
				r.Decided(t0, k, i%3 == 0)
			}
		})
	}
	wg.Wait()
	exact := make(map[string]uint64)
	for _, ks := range keys {
		for _, k := range ks {
			exact[k]++
		}
	}
	s := r.Snapshot(t0, -1, 1)
	if s.Decisions.Total != workers*per || s.Seconds[0].Decisions != workers*per {
		t.Errorf("Total = %d, Seconds = %+v; want %d decisions", s.Decisions.Total, s.Seconds, workers*per)
	}
	listed := make(map[string]bool)
	for _, e := range s.Decisions.Entries {
		listed[e.Key] = true
		if n := exact[e.Key]; n > e.Count || n < e.Count-e.Err {
			t.Errorf("%s: %d ± %d; it was decided %d times", e.Key, e.Count, e.Err, n)
		}
	}
	for k, n := range exact {
		if !listed[k] && n > s.Decisions.Floor {
			t.Errorf("%s decided %d times, above Floor %d, not listed", k, n, s.Decisions.Floor)
		}
	}
	if limit := uint64(workers*per) / 32; s.Decisions.Floor > limit {
		t.Errorf("Floor = %d; want at most Total/Capacity = %d", s.Decisions.Floor, limit)
	}
}

// TestLatencyBuckets: every latency is at most its bucket's upper bound
// and within 25% of it.
func TestLatencyBuckets(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 3 * time.Microsecond, 4 * time.Microsecond,
		9 * time.Microsecond, 250 * time.Microsecond, 3 * time.Millisecond, time.Second, time.Minute} {
		i := latencyBucket(d)
		up := latencyUpper(i)
		if d >= up || (d >= 4*time.Microsecond && float64(up) > 1.25*float64(d)+float64(time.Microsecond)) {
			t.Errorf("latencyBucket(%v) = %d, upper bound %v; want a bound above %v within 25%%", d, i, up, d)
		}
		if i > 0 && d >= 4*time.Microsecond && latencyUpper(i-1) > d {
			t.Errorf("latencyBucket(%v) = %d, but bucket %d ends at %v", d, i, i-1, latencyUpper(i-1))
		}
	}
}

// BenchmarkDecided is the cost of counting one decision, from as many
// goroutines as GOMAXPROCS: on one hot key, and on skewed traffic over
// 100,000 keys (most of them new to the sketches, the worst case).
func BenchmarkDecided(b *testing.B) {
	stream := make([]string, 1<<16)
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 100_000)
	for i := range stream {
		stream[i] = fmt.Sprintf("tenant:%d", z.Uint64())
	}
	for _, bc := range []struct {
		name string
		key  func(i int) string
	}{
		{"hot key", func(int) string { return "hot" }},
		{"zipf", func(i int) string { return stream[i&(1<<16-1)] }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRecorder(b, Config{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(1 << 16)
				for pb.Next() {
					r.Decided(t0, bc.key(i), i%8 == 0)
					i++
				}
			})
		})
	}
}
