package loadgen

import (
	"sync"
	"testing"
	"time"
)

// TestScheduleEvenlySpaced: call i is due at start + i/rate.
func TestScheduleEvenlySpaced(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		rate float64
		slot int64
		want time.Duration
	}{
		{1000, 0, 0},
		{1000, 1, time.Millisecond},
		{1000, 2500, 2500 * time.Millisecond},
		{3, 1, 333333333},
		{3, 3, time.Second},
		{0.5, 3, 6 * time.Second},
		{1e6, 3_600_000_000, time.Hour},
	} {
		s := newSchedule(start, tc.rate)
		if got := s.at(tc.slot).Sub(start); got != tc.want {
			t.Errorf("rate %g: call %d due at start+%v; want start+%v", tc.rate, tc.slot, got, tc.want)
		}
	}
}

// TestScheduleClaimsEachCallOnce: concurrent workers claim every call once,
// in order.
func TestScheduleClaimsEachCallOnce(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newSchedule(start, 1e9) // one call per nanosecond: at is the slot
	const workers, each = 8, 1000
	var mu sync.Mutex
	seen := make(map[time.Duration]int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var last time.Duration = -1
			for range each {
				d := s.claim().Sub(start)
				if d <= last {
					t.Errorf("a worker claimed start+%v after start+%v; want increasing times", d, last)
				}
				last = d
				mu.Lock()
				seen[d]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := range workers * each {
		if n := seen[time.Duration(i)]; n != 1 {
			t.Errorf("call %d was claimed %d times; want once", i, n)
		}
	}
}
