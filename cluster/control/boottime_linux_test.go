package control

import "testing"

// TestBootClockFollowsTheKernel: bootCache on the real clocks reads
// CLOCK_BOOTTIME as the kernel does, never ahead of it and at most
// bootTolerance behind, and seldom through the kernel.
func TestBootClockFollowsTheKernel(t *testing.T) {
	kernel := 0
	c := &bootCache{now: timeNow, boot: func() int64 { kernel++; return kernelBoottime() }}
	const reads = 10000
	for range reads {
		before := kernelBoottime()
		got := int64(c.read())
		after := kernelBoottime()
		if got < before-bootTolerance || got > after {
			t.Fatalf("read %d between the kernel's %d and %d; want at most %d ns behind, never ahead", got, before, after, bootTolerance)
		}
	}
	if kernel > reads/10 {
		t.Errorf("%d of %d reads went through the kernel; want few", kernel, reads)
	}
	t.Logf("%d of %d reads went through the kernel", kernel, reads)
	if got := int64(bootClock{}.Now()); got > kernelBoottime() {
		t.Errorf("bootClock read %d, ahead of the kernel", got)
	}
}
