// Package clock abstracts time so that the limiter can be tested without
// waiting for windows to pass. Real is the wall clock; Fake moves only when a
// test tells it to.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a stopped-or-running timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that the limiter uses.
type Timer interface {
	// C delivers the time when the timer fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped it.
	Stop() bool
	// Reset changes the timer to fire after d.
	Reset(d time.Duration)
	// ResetAt changes the timer to fire when the clock reads at, at once
	// if it already does. Reset(at.Sub(Now())) fires late by as much as
	// the clock moved between the two calls: a test's fake clock can move
	// a minute there.
	ResetAt(at time.Time)
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Stop() bool            { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) ResetAt(at time.Time)  { r.t.Reset(time.Until(at)) }

// Fake is a clock that moves only on Advance or Set. It is safe for
// concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.arm(f.now.Add(d))
	return t
}

// Advance moves the clock forward by d and fires the timers that came due, in
// deadline order.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the clock to t (never backwards) and fires the timers that came
// due, in deadline order.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.now = t
	}
	due := f.timers[:0:0]
	kept := f.timers[:0]
	for _, ft := range f.timers {
		if !ft.when.After(f.now) {
			due = append(due, ft)
		} else {
			kept = append(kept, ft)
		}
	}
	f.timers = kept
	sort.Slice(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	for _, ft := range due {
		ft.armed = false
		select {
		case ft.c <- f.now:
		default:
		}
	}
}

// Pending returns how many timers are armed. Tests use it to show that nothing
// will wake up.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextDeadline returns when the earliest armed timer fires, and false when
// none is armed.
func (f *Fake) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var min time.Time
	for _, ft := range f.timers {
		if min.IsZero() || ft.when.Before(min) {
			min = ft.when
		}
	}
	return min, !min.IsZero()
}

type fakeTimer struct {
	f     *Fake
	c     chan time.Time
	when  time.Time
	armed bool
}

// arm must be called with f.mu held.
func (t *fakeTimer) arm(when time.Time) {
	t.when = when
	if !when.After(t.f.now) {
		select {
		case t.c <- t.f.now:
		default:
		}
		return
	}
	t.armed = true
	t.f.timers = append(t.f.timers, t)
}

// disarm must be called with f.mu held.
func (t *fakeTimer) disarm() bool {
	if !t.armed {
		return false
	}
	t.armed = false
	for i, ft := range t.f.timers {
		if ft == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	return true
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.disarm()
}

func (t *fakeTimer) Reset(d time.Duration) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.reset(t.f.now.Add(d))
}

func (t *fakeTimer) ResetAt(at time.Time) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.reset(at)
}

// reset must be called with f.mu held.
func (t *fakeTimer) reset(when time.Time) {
	t.disarm()
	// Like time.Timer since Go 1.23: a reset timer never delivers a stale value.
	select {
	case <-t.c:
	default:
	}
	t.arm(when)
}
