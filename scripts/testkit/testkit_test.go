package testkit

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records what a helper reports instead of failing the test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

// TestEventuallyReturnsOnceCondHolds: Eventually returns as soon as cond
// holds, after polling it as often as it took, and fails nothing.
func TestEventuallyReturnsOnceCondHolds(t *testing.T) {
	var calls atomic.Int32
	ft := &fakeT{TB: t}
	start := time.Now()
	Eventually(ft, 10*time.Second, func() bool { return calls.Add(1) >= 5 }, "the fifth call")
	if ft.failed != "" {
		t.Errorf("Eventually failed: %s; want it to return when cond holds", ft.failed)
	}
	if got := calls.Load(); got != 5 {
		t.Errorf("cond called %d times; want 5", got)
	}
	// Pauses of 1, 2, 4 and 8 ms: 15 ms, well below 250 ms even on a
	// loaded machine (pauses of 100 ms from the start would take 400).
	if elapsed := time.Since(start); elapsed > 250*time.Millisecond {
		t.Errorf("Eventually took %v for a cond that held on the fifth call; want the first polls quick", elapsed)
	}
}

// TestEventuallyFailsAtDeadline: a cond that never holds fails the test
// once the timeout passed, saying what was awaited and for how long.
func TestEventuallyFailsAtDeadline(t *testing.T) {
	ft := &fakeT{TB: t}
	start := time.Now()
	Eventually(ft, 50*time.Millisecond, func() bool { return false }, "key %q to %s", "k", "empty")
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Errorf("Eventually gave up after %v; want at least the 50ms timeout", elapsed)
	}
	want := `testkit: after 50ms, still waiting for key "k" to empty`
	if ft.failed != want {
		t.Errorf("Eventually failed with %q; want %q", ft.failed, want)
	}
}

// TestWait: Wait returns nil once f does, and f's last error, wrapped and
// saying how long it waited, when the timeout passes first.
func TestWait(t *testing.T) {
	n := 0
	if err := Wait(10*time.Second, func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Wait = %v after %d calls; want nil after 3", err, n)
	}

	errLast := errors.New("still down")
	err := Wait(20*time.Millisecond, func() error { return errLast })
	if !errors.Is(err, errLast) || !strings.Contains(err.Error(), "after 20ms") {
		t.Errorf("Wait = %v; want f's last error, after 20ms", err)
	}
}

// TestSyncBuffer: writes from many goroutines all arrive (go test -race
// checks that they do not race).
func TestSyncBuffer(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.Len(); got != 800 || b.String() != strings.Repeat("x", 800) {
		t.Errorf("after 800 writes of one byte, Len() = %d; want 800", got)
	}
}

func TestTail(t *testing.T) {
	tail := NewTail(3)
	if got := tail.String(); got != "" {
		t.Errorf("empty tail: %q", got)
	}
	tail.Write([]byte("a\n"))
	tail.Write([]byte("b\nc\n"))
	if got := tail.String(); got != "a\nb\nc\n" {
		t.Errorf("three lines: %q", got)
	}
	tail.Write([]byte("d\ne\n"))
	if got := tail.String(); got != "c\nd\ne\n" {
		t.Errorf("after five lines: %q; want the last three", got)
	}
}
