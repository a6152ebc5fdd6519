//go:build unix

package api

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used (user and system), for
// benchmarks whose wall time other processes on the machine disturb.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
