package cluster

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/persist"
)

// TestLeaseRunsFromTheSendTime: a lease granted by a majority runs until L
// after the renewal was sent, not after the grants came back, and a later
// renewal only lengthens it.
func TestLeaseRunsFromTheSendTime(t *testing.T) {
	clk := clock.NewFake(t0)
	l, err := newLease(clk, time.Second, 0.1, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.quorum != 2 || l.valid() {
		t.Fatalf("new lease: quorum %d, valid %v; want 2, false", l.quorum, l.valid())
	}
	sent := l.now()
	clk.Advance(400 * time.Millisecond) // the grants took this long
	l.extend(sent)
	if !l.valid() || l.remaining() != 600*time.Millisecond {
		t.Fatalf("after extend: valid %v, remaining %v; want true, 600ms", l.valid(), l.remaining())
	}
	l.extend(sent - int64(time.Second)) // an older round answered late
	if l.remaining() != 600*time.Millisecond {
		t.Fatalf("an older renewal shortened the lease to %v", l.remaining())
	}
	clk.Advance(600 * time.Millisecond)
	if l.valid() {
		t.Fatal("lease valid L after the renewal was sent")
	}
	if got := l.fenceWait(); got != 1100*time.Millisecond {
		t.Fatalf("fenceWait = %v; want L·(1+ρ) = 1.1s", got)
	}
}

// TestLeasePromisesSurviveRestart: a promise to fence an incarnation
// refuses it and every older one, not a newer one, and holds after the
// node restarts on the same data file.
func TestLeasePromisesSurviveRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.db")
	store, err := persist.Open(persist.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	l, err := newLease(clk, time.Second, 0.1, 3, store)
	if err != nil {
		t.Fatal(err)
	}
	if ok, fenced := l.grant("b", 5); !ok || fenced {
		t.Fatalf("grant(b 5) before any promise = %v, %v; want granted", ok, fenced)
	}
	if err := l.promise("b", 5); err != nil {
		t.Fatal(err)
	}
	check := func(l *lease) {
		t.Helper()
		for _, c := range []struct {
			inc  uint64
			want bool
		}{{4, false}, {5, false}, {6, true}} {
			ok, fenced := l.grant("b", c.inc)
			if ok != c.want || fenced == c.want {
				t.Errorf("grant(b %d) = granted %v, fenced %v; want granted %v", c.inc, ok, fenced, c.want)
			}
		}
		if ok, _ := l.grant("c", 1); !ok {
			t.Errorf("grant(c 1) refused; only b was fenced")
		}
	}
	check(l)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	store, err = persist.Open(persist.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	l, err = newLease(clk, time.Second, 0.1, 3, store)
	if err != nil {
		t.Fatal(err)
	}
	check(l)
}
