package control

import (
	"sync/atomic"
	"time"
)

// bootCache reads CLOCK_BOOTTIME without a system call on most reads. A
// read through the kernel takes about 1.7 µs on the development machine,
// where time.Now, which the vDSO answers, takes 65 ns; a clustered node
// reads the boot clock at least twice per call (its lease, before and
// after deciding), which was 3% of the nodes' CPU.
//
// CLOCK_BOOTTIME and CLOCK_MONOTONIC differ by the time the machine spent
// suspended, and by nothing else: when it resumes, the kernel adds that
// time to CLOCK_BOOTTIME and to the wall clock (CLOCK_REALTIME), not to
// CLOCK_MONOTONIC. So bootCache reads CLOCK_BOOTTIME once, keeps its
// distance to the monotonic clock (base) and the wall clock's (skew), and
// from then on derives the boot clock from the monotonic one while the
// wall clock keeps its distance. A resume moves the wall clock forward
// against the monotonic one, and so does a step of the wall clock (NTP,
// an operator): either makes the next read go to the kernel and start
// over. A read is off by at most bootTolerance, against the 10% of the
// lease (200 ms) that the leases allow for clocks that disagree; a resume
// goes unseen only if a step of the wall clock between two reads cancels
// it to within 2·bootTolerance.
type bootCache struct {
	// now reads the wall clock, then the monotonic clock, as time.Now
	// does, in nanoseconds.
	now func() (wall, mono int64)
	// boot reads CLOCK_BOOTTIME through the kernel.
	boot func() int64

	last atomic.Pointer[bootSync]
}

// bootSync is what bootCache learnt at its last read of CLOCK_BOOTTIME.
type bootSync struct {
	skew int64 // the wall clock less the monotonic clock
	base int64 // CLOCK_BOOTTIME less the monotonic clock
}

// bootTolerance bounds how far apart a sample's monotonic readings may be
// (sample), and how far the wall clock may move against the monotonic
// one, before a read goes to the kernel.
const bootTolerance = int64(20 * time.Microsecond)

// sample reads the clocks twice: the first monotonic reading and the
// second, which bracket the second wall reading, are at most bootTolerance
// apart (ok), or the thread was held up between them and the skew cannot
// be trusted. A suspend between the readings either shows in the skew (it
// came before the wall reading) or leaves a reading of the moment before
// it, as if the suspend had come just after a read.
func (c *bootCache) sample() (skew, mono int64, ok bool) {
	_, m0 := c.now()
	w, m1 := c.now()
	return w - m1, m1, m1-m0 <= bootTolerance
}

// read returns CLOCK_BOOTTIME.
func (c *bootCache) read() time.Duration {
	if s := c.last.Load(); s != nil {
		if skew, mono, ok := c.sample(); ok && abs(skew-s.skew) <= bootTolerance {
			return time.Duration(s.base + mono)
		}
	}
	return c.resync()
}

// resync reads CLOCK_BOOTTIME through the kernel and, when samples taken
// just before and just after agree (no suspend and no step of the wall
// clock between them, no thread held up), keeps what it learnt.
func (c *bootCache) resync() time.Duration {
	for range 3 {
		skew0, m0, ok0 := c.sample()
		b := c.boot()
		skew1, m1, ok1 := c.sample()
		if ok0 && ok1 && m1-m0 <= bootTolerance && abs(skew1-skew0) <= bootTolerance {
			c.last.Store(&bootSync{skew: skew1, base: b - m1})
			return time.Duration(b)
		}
	}
	c.last.Store(nil)
	return time.Duration(c.boot())
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
