package clock

import (
	"testing"
	"time"
)

// TestResetAtIsAbsolute: a timer reset to a time fires when the clock
// reads it, however far the clock moved between the caller's reading and
// the reset; Reset by the difference would fire that much later. This is
// how the engine's janitor lost its sweep when a test moved the clock
// while it armed its timer.
func TestResetAtIsAbsolute(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	tm := f.NewTimer(time.Hour)
	read := f.Now()             // the caller reads the clock...
	f.Advance(30 * time.Second) // ...the clock moves...
	tm.ResetAt(read.Add(time.Minute))
	f.Advance(30 * time.Second) // the clock reads read+1m
	select {
	case got := <-tm.C():
		if !got.Equal(t0.Add(time.Minute)) {
			t.Errorf("fired at %v; want %v", got, t0.Add(time.Minute))
		}
	default:
		t.Fatalf("not fired at %v; want fired at the time it was reset to", f.Now())
	}

	tm.ResetAt(t0) // a time the clock passed: at once
	select {
	case <-tm.C():
	default:
		t.Fatal("ResetAt(a past time) did not fire at once")
	}
	if f.Pending() != 0 {
		t.Errorf("%d timers armed; want 0", f.Pending())
	}
}
