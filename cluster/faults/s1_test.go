//go:build linux

package faults

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The bounds of the S1 check (see the package doc, "S1: one decider").
const (
	// clockMargin (δ) is how much later than another a call must be sent
	// to count as certainly after it: every client runs in the test
	// process and reads one monotonic clock, and a decision happens between
	// its call's send and its reply, so no margin is needed in principle;
	// 2 ms keeps the check off the edge.
	clockMargin = 2 * time.Millisecond
	// handoverHorizon (H) is less than any legitimate pair of handovers of
	// one key, A to B and back to A, can take. Each handover passes either a
	// fence (the old holder's lease must have lapsed: L·(1+ρ) = 1.1 s after
	// the last promise) or a node's departure and return (SIGTERM, a
	// process start, a lease round and the others' completes: above a
	// second in every run of the suite). 300 ms is well under both, and
	// well over the tens of milliseconds between two decisions of one key
	// under the suite's load.
	handoverHorizon = 300 * time.Millisecond
)

// overlap is the evidence that two nodes decided one key at once: a1 and
// a2 were allowed by one node, b by another, b certainly after a1 and
// before a2, and a1 to a2 too short for the key to have moved away and
// back.
type overlap struct {
	a1, b, a2 call
}

func (o overlap) String() string {
	t0 := o.a1.sent
	at := func(c call) string {
		return fmt.Sprintf("%s [%.1f, %.1f] ms", c.node, ms(c.sent.Sub(t0)), ms(c.replied.Sub(t0)))
	}
	return fmt.Sprintf("allowed by %s, then %s, then %s (sent, replied; from %s)", at(o.a1), at(o.b), at(o.a2), t0.Format("15:04:05.000"))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// s1Overlaps returns the evidence, in one key's calls, of two nodes
// allowing the key at once: every allowed call a1 (by node A) that starts
// a pattern A, B, A with B another node, where
//
//	replied(a1) + δ < sent(b),  replied(b) + δ < sent(a2),
//	replied(a2) − sent(a1) < H.
//
// Each decision happened at some instant between its call's send and its
// reply, so b was decided after a1 and a2 after b, by one clock; and a1
// and a2 were decided less than H apart, too close for the key to have
// moved from A to B and back (see handoverHorizon). So A decided the key
// both before and after B did, within H: two deciders. Denied and failed
// calls are not decisions that count here. The check never blames a
// legitimate handover, however slow the calls; slow calls only hide
// overlaps (their intervals order nothing).
func s1Overlaps(calls []call) []overlap {
	var ok []call
	for _, c := range calls {
		if c.outcome == allowed {
			ok = append(ok, c)
		}
	}
	slices.SortFunc(ok, func(a, b call) int { return a.sent.Compare(b.sent) })
	var found []overlap
	for i, a1 := range ok {
		horizon := a1.sent.Add(handoverHorizon)
		// Every call of a pattern starting at a1 was sent within H of it.
		end := i + 1
		for end < len(ok) && ok[end].sent.Before(horizon) {
			end++
		}
		// The other node's call certainly after a1 that replied first: any
		// a2 after some b is after this one.
		var b *call
		for j := i + 1; j < end; j++ {
			c := &ok[j]
			if c.node != a1.node && c.sent.After(a1.replied.Add(clockMargin)) && (b == nil || c.replied.Before(b.replied)) {
				b = c
			}
		}
		if b == nil {
			continue
		}
		for j := i + 1; j < end; j++ {
			a2 := ok[j]
			if a2.node == a1.node && a2.sent.After(b.replied.Add(clockMargin)) && a2.replied.Sub(a1.sent) < handoverHorizon {
				found = append(found, overlap{a1, *b, a2})
				break
			}
		}
	}
	return found
}

// TestS1Overlaps: the S1 check catches two nodes allowing one key at once,
// and passes every legitimate handover, a restart's A to B and back to A
// included, however the calls' intervals fall.
func TestS1Overlaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(msec float64) time.Time { return t0.Add(time.Duration(msec * float64(time.Millisecond))) }
	// c is a call allowed by node, sent at from ms and answered at to ms.
	c := func(node string, from, to float64) call {
		return call{node: node, sent: at(from), replied: at(to), outcome: allowed}
	}
	// every returns calls allowed by node every step ms from from to to,
	// each answered 1 ms after it was sent.
	every := func(node string, from, to, step float64) []call {
		var out []call
		for x := from; x <= to; x += step {
			out = append(out, c(node, x, x+1))
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		calls []call
		want  bool // an overlap
	}{
		{"one node", every("n1", 0, 2000, 10), false},
		{"handover: n1 stops, n2 starts", append(every("n1", 0, 1000, 10), every("n2", 1005, 2000, 10)...), false},
		{"handover with a slow last call", append(every("n1", 0, 1000, 10), append([]call{c("n1", 1000, 1400)}, every("n2", 1100, 2000, 10)...)...), false},
		{"restart: n1, n2 for 1 s, n1 again", append(append(every("n1", 0, 1000, 10), every("n2", 1005, 2000, 10)...), every("n1", 2005, 3000, 10)...), false},
		{"restart in 400 ms, over H", append(append(every("n1", 0, 1000, 10), every("n2", 1100, 1300, 10)...), every("n1", 1400, 2000, 10)...), false},
		{"two deciders alternating", append(every("n1", 0, 1000, 10), every("n2", 5, 1005, 10)...), true},
		{"two deciders for 50 ms amid one", append(every("n1", 0, 1000, 10), every("n2", 500, 550, 10)...), true},
		{"one late decision of the old owner", append(append(every("n1", 0, 1000, 10), every("n2", 1005, 2000, 10)...), c("n1", 1050, 1051)), true},
		{"A, B, A in 200 ms", []call{c("n1", 0, 1), c("n2", 100, 101), c("n1", 200, 201)}, true},
		{"A, B, A but B overlaps a slow A", []call{c("n1", 0, 500), c("n2", 100, 101), c("n1", 200, 201)}, false},
		{"A, B, A within the clock margin", []call{c("n1", 0, 1), c("n2", 2.5, 3.5), c("n1", 5, 6)}, false},
		{"A, B, A just past the clock margin", []call{c("n1", 0, 1), c("n2", 3.5, 4.5), c("n1", 7, 8)}, true},
		{"A, B, A with a2 answered after H", []call{c("n1", 0, 1), c("n2", 100, 101), c("n1", 200, 301)}, false},
		{"denied and failed calls decide nothing", []call{c("n1", 0, 1), {node: "n2", sent: at(100), replied: at(101), outcome: denied}, {sent: at(120), replied: at(121), outcome: failed}, c("n1", 200, 201)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s1Overlaps(tc.calls)
			if (len(got) > 0) != tc.want {
				t.Errorf("s1Overlaps(%d calls) = %d overlaps %v; want overlaps: %v", len(tc.calls), len(got), got, tc.want)
			}
		})
	}
}
