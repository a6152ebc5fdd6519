package actor

import (
	"runtime"
	"testing"
	"time"
)

// TestStateMemoryPerKey reports the heap bytes one key's state takes, for a
// full sliding log of limit 100 (100 hits at distinct times, the worst case)
// and for each counter algorithm, measured over 10000 states.
func TestStateMemoryPerKey(t *testing.T) {
	const keys = 10000
	measure := func(build func(s *state)) float64 {
		states := make([]*state, keys)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range states {
			s := new(state)
			build(s)
			states[i] = s
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(states)
		return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / keys
	}
	// hits builds n cost-1 hits, sharing a timestamp perRun at a time, 1ms
	// apart.
	hits := func(algo Algorithm, limit int64, n, perRun int) func(*state) {
		return func(s *state) {
			c := Check{Key: "k", Limit: limit, Window: stMin, Algorithm: algo, Cost: 1}
			var d Decision
			for i := range n {
				s.decide(st0+int64(i/perRun)*int64(stMs), &c, 1000, &d)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		build func(*state)
		most  float64 // a loose ceiling, to catch regressions
	}{
		{"sliding_log, limit 100, 100 runs", hits(SlidingLog, 100, 100, 1), 2000},
		{"sliding_log, limit 100, 10 runs of 10", hits(SlidingLog, 100, 100, 10), 500},
		{"sliding_log, limit 100, 1 run of 100", hits(SlidingLog, 100, 100, 100), 200},
		{"sliding_window", hits(SlidingWindow, 100, 100, 1), 100},
		{"token_bucket", hits(TokenBucket, 100, 100, 1), 100},
	} {
		got := measure(tc.build)
		t.Logf("%s: %.0f bytes per key", tc.name, got)
		if got > tc.most {
			t.Errorf("%s: %.0f bytes per key; want at most %.0f", tc.name, got, tc.most)
		}
	}
}

// BenchmarkDecide measures one decision on a key in steady state: the sliding
// log at its limit (each check expires one run and appends one), and the two
// counters. decide must not allocate once the log has grown.
func BenchmarkDecide(b *testing.B) {
	for _, bc := range []struct {
		name          string
		algo          Algorithm
		limit         int64
		window        time.Duration
		step, maxRuns int64
	}{
		{name: "log", algo: SlidingLog, limit: 100, window: stSec, step: int64(10 * stMs), maxRuns: 1000},
		{name: "log-limit-10000", algo: SlidingLog, limit: 10000, window: stSec, step: int64(100 * time.Microsecond), maxRuns: 100000},
		{name: "log-rounded", algo: SlidingLog, limit: 1_000_000, window: stSec, step: 997, maxRuns: 1000},
		{name: "window", algo: SlidingWindow, limit: 100, window: stSec, step: int64(7 * stMs), maxRuns: 1000},
		{name: "bucket", algo: TokenBucket, limit: 100, window: stSec, step: int64(7 * stMs), maxRuns: 1000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var s state
			var d Decision
			c := Check{Key: "k", Limit: bc.limit, Window: bc.window, Algorithm: bc.algo, Cost: 1}
			now := st0
			for range 2 * bc.limit { // fill the log and grow its ring
				now += bc.step
				s.decide(now, &c, int(bc.maxRuns), &d)
			}
			allowed := 0
			b.ReportAllocs()
			for b.Loop() {
				now += bc.step
				s.decide(now, &c, int(bc.maxRuns), &d)
				if d.Allowed {
					allowed++
				}
			}
			if allowed == 0 {
				b.Fatal("nothing allowed")
			}
		})
	}
}

// TestDecideDoesNotAllocate checks that a decision in steady state allocates
// nothing.
func TestDecideDoesNotAllocate(t *testing.T) {
	for _, algo := range []Algorithm{SlidingLog, SlidingWindow, TokenBucket} {
		var s state
		var d Decision
		c := Check{Key: "k", Limit: 100, Window: stSec, Algorithm: algo, Cost: 1}
		now := st0
		for range 300 {
			now += int64(10 * stMs)
			s.decide(now, &c, 1000, &d)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			now += int64(10 * stMs)
			s.decide(now, &c, 1000, &d)
		})
		if allocs != 0 {
			t.Errorf("%v: decide allocates %v times per call in steady state; want 0", algo, allocs)
		}
	}
}
