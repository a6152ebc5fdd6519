//go:build !linux

package control

import "time"

var processStart = time.Now()

// bootClock is the monotonic clock where CLOCK_BOOTTIME does not exist: a
// suspended machine's lease then outlives the suspension (see
// docs/cluster.md, "Timing assumptions").
type bootClock struct{}

func (bootClock) Now() time.Duration { return time.Since(processStart) }
