//go:build !unix

package api

import "time"

// cpuTime is 0 where getrusage is missing: benchmarks report no CPU time.
func cpuTime() time.Duration { return 0 }
