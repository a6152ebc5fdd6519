package control

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootClock reads CLOCK_BOOTTIME: it counts through a suspend of the
// machine (a VM paused whole), as CLOCK_MONOTONIC does not, so that a node
// that wakes finds its lease over. Most reads are the monotonic clock's
// (see bootCache).
type bootClock struct{}

func (bootClock) Now() time.Duration { return boot.read() }

var boot = bootCache{now: timeNow, boot: kernelBoottime}

// monoStart anchors timeNow's monotonic readings.
var monoStart = time.Now()

// timeNow is one time.Now: the wall clock read first, then the monotonic
// clock (runtime/time_linux_amd64.s; runtime.time_now elsewhere).
func timeNow() (wall, mono int64) {
	t := time.Now()
	return t.UnixNano(), int64(t.Sub(monoStart))
}

func kernelBoottime() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic("control: clock_gettime(CLOCK_BOOTTIME): " + err.Error()) // in every Linux since 2.6.39
	}
	return ts.Nano()
}
