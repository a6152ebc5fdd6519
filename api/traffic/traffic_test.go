package traffic

import (
	"fmt"
	"math/rand/v2"
	"strings"
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

// request counts a request of the given checks (keys, each denied if its
// name ends in "!"), answered after latency.
func request(r *Recorder, now time.Time, latency time.Duration, keys ...string) {
	r.Request(now, latency, 0, len(keys), func(i int) (string, bool, bool) {
		k, denied := strings.CutSuffix(keys[i], "!")
		return k, denied, k != "-" // "-" is a descriptor without a limit
	})
}

// TestSnapshot: the top keys, per-second counts and latency of what was
// recorded, read back.
func TestSnapshot(t *testing.T) {
	r := newRecorder(t, Config{})
	now := t0.Add(3 * time.Second) // 3 s into a bucket
	for i := range 10 {
		key := "hot"
		if i >= 7 {
			key = "hot!"
		}
		request(r, now, time.Duration(i+1)*10*time.Millisecond, key)
	}
	request(r, now, time.Millisecond, "-", "cold", "-")
	request(r, now.Add(-time.Second), time.Millisecond, "cold!")
	r.Request(now, time.Millisecond, 2, 0, nil) // a request that failed
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
		{Unix: now.Unix() - 1, Decisions: 1, Denials: 1, Requests: 1},
		{Unix: now.Unix(), Decisions: 11, Denials: 3, Errors: 2, Requests: 12},
	}
	if fmt.Sprint(s.Seconds) != fmt.Sprint(want) {
		t.Errorf("Seconds = %+v; want %+v", s.Seconds, want)
	}
	// 13 latencies: 1 ms three times, then 10, 20, ... 100 ms.
	l := s.Latency
	if l.Requests != 13 || l.Max != 100*time.Millisecond ||
		l.P50 < 40*time.Millisecond || l.P50 > 50*time.Millisecond || l.P99 != 100*time.Millisecond {
		t.Errorf("Latency = %+v; want 13 requests, p50 in [40ms, 50ms], p99 and max 100ms", l)
	}
}

// TestOldCountsLeave: counts older than the window leave the snapshot, and
// a slot the clock comes back to starts from zero.
func TestOldCountsLeave(t *testing.T) {
	r := newRecorder(t, Config{Seconds: 10})
	request(r, t0, time.Second, "old!")
	r.Request(t0, time.Second, 1, 0, nil)
	later := t0.Add(time.Minute)
	request(r, later, time.Millisecond, "new")
	s := r.Snapshot(later, 10, 10)
	if got := fmt.Sprint(s.Decisions.Entries); got != "[{new 1 0}]" || len(s.Denials.Entries) != 0 || s.Latency.Requests != 1 {
		t.Errorf("a minute later: Decisions = %s, Denials = %v, Latency = %+v; want only new, no denials, one request", got, s.Denials.Entries, s.Latency)
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
				if i%3 == 0 {
					k += "!"
				}
				request(r, t0, time.Millisecond, k)
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

// BenchmarkRequest is the cost of counting a request of one check, from
// as many goroutines as GOMAXPROCS: on one hot key, and on skewed traffic
// over 100,000 keys (most of them new to the sketches, the worst case).
func BenchmarkRequest(b *testing.B) {
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
					key, denied := bc.key(i), i%8 == 0
					r.Request(t0, time.Millisecond, 0, 1, func(int) (string, bool, bool) { return key, denied, true })
					i++
				}
			})
		})
	}
}
