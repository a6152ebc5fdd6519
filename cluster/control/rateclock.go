package control

import "time"

// RateClock is a Clock that runs at Rate times the speed of Base from the
// moment it was made: a node whose lease clock runs slow or fast, for the
// fault suite's rows on clock drift. The lease argument assumes clock
// rates within ClockDrift; a rate beyond it lets a lease outlive the
// leader's wait (docs/cluster.md, "Timing assumptions").
type RateClock struct {
	base   Clock
	rate   float64
	origin time.Duration
}

// NewRateClock returns a clock running at rate times base's speed (base
// nil: CLOCK_BOOTTIME). A rate of 0 or less is taken as 1.
func NewRateClock(base Clock, rate float64) *RateClock {
	if base == nil {
		base = bootClock{}
	}
	if rate <= 0 {
		rate = 1
	}
	return &RateClock{base: base, rate: rate, origin: base.Now()}
}

// Now implements Clock.
func (c *RateClock) Now() time.Duration {
	return c.origin + time.Duration(float64(c.base.Now()-c.origin)*c.rate)
}
