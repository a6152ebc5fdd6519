//go:build linux

package main

import (
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFsyncOneCPU: on a single CPU, serve --durability fsync raises
// GOMAXPROCS to 2 (so that decisions go on while the writer syncs), and the
// other modes leave it alone.
func TestFsyncOneCPU(t *testing.T) {
	t.Parallel()
	const raised = "GOMAXPROCS raised to 2"
	for _, tc := range []struct {
		durability string
		want       bool
	}{{"fsync", true}, {"commit", false}} {
		p := startOnOneCPU(t, "--durability", tc.durability)
		if got := strings.Contains(p.logs.String(), raised); got != tc.want {
			t.Errorf("--durability %s on one CPU: log says %q: %v; want %v\n%s", tc.durability, raised, got, tc.want, p.logs)
		}
	}
}

// startOnOneCPU starts the binary (startProc) with its CPU affinity set to
// one CPU, which the child inherits from the thread that starts it.
func startOnOneCPU(t *testing.T, args ...string) *proc {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	for cpu := 0; cpu < 1024; cpu++ {
		if all.IsSet(cpu) {
			one.Set(cpu)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Skipf("sched_setaffinity: %v", err)
	}
	defer func() {
		if err := unix.SchedSetaffinity(0, &all); err != nil {
			t.Fatalf("restore the CPU affinity: %v", err)
		}
	}()
	return startProc(t, t.TempDir(), args...)
}
