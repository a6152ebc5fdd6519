package testkit

import (
	"fmt"
	"testing"
	"time"
)

// The pause between two polls starts at minPause and doubles up to
// maxPause, so that a condition that is met quickly is seen quickly and one
// that takes seconds is not polled a thousand times a second.
const (
	minPause = time.Millisecond
	maxPause = 10 * time.Millisecond
)

// Eventually polls cond until it returns true, and fails t (t.Fatalf) if
// timeout passes first, with the message format and args describe (what
// was awaited) after the time it waited. cond runs on the caller's
// goroutine, at least once, and once more after the deadline; it should
// not block for long.
//
//	testkit.Eventually(t, 10*time.Second, func() bool { return n.Ready() }, "node %s ready", n.Name)
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("testkit: after %v, still waiting for %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Wait polls f until it returns nil and returns nil then; if timeout passes
// first it returns f's last error, saying how long it waited. It does not
// touch a testing.T, so that goroutines other than the test's may wait;
// the test fails with the error:
//
//	if err := testkit.Wait(10*time.Second, func() error { return n.Ping() }); err != nil {
//		t.Fatal(err)
//	}
func Wait(timeout time.Duration, f func() error) error {
	var last error
	if poll(timeout, func() bool { last = f(); return last == nil }) {
		return nil
	}
	return fmt.Errorf("after %v: %w", timeout, last)
}

// poll reports whether cond held before timeout passed; cond is asked once
// more at the deadline.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := minPause; ; pause = min(2*pause, maxPause) {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pause, left)) // the pause between polls
	}
}
