package control

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootClock reads CLOCK_BOOTTIME: it counts through a suspend of the
// machine (a VM paused whole), as CLOCK_MONOTONIC does not, so that a node
// that wakes finds its lease over.
type bootClock struct{}

func (bootClock) Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("control: clock_gettime(CLOCK_BOOTTIME): " + err.Error()) // in every Linux since 2.6.39
	}
	return time.Duration(ts.Nano())
}
