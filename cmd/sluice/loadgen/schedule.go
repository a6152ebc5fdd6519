package loadgen

import (
	"sync/atomic"
	"time"
)

// schedule is the timetable of an open loop: call i is due at start +
// i/rate, evenly spread whatever the server does. Workers claim calls in
// order; it is safe for concurrent use.
type schedule struct {
	start time.Time
	rate  float64 // calls per second, > 0
	next  atomic.Int64
}

func newSchedule(start time.Time, rate float64) *schedule {
	return &schedule{start: start, rate: rate}
}

// at returns when call slot is due.
func (s *schedule) at(slot int64) time.Time {
	return s.start.Add(time.Duration(float64(slot) * 1e9 / s.rate))
}

// claim takes the next call that no worker took yet and returns when it is
// due, which may be in the past if the workers fell behind.
func (s *schedule) claim() time.Time {
	return s.at(s.next.Add(1) - 1)
}
