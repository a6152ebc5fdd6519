package actor

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkAlarms fails t unless h is a heap whose entries know their places.
func checkAlarms(t *testing.T, h alarmHeap) {
	t.Helper()
	for i := range h {
		if got := int(h[i].ent.heapIdx); got != i {
			t.Fatalf("entry at %d says %d", i, got)
		}
		if i > 0 {
			if p := (i - 1) / alarmArity; h[p].at > h[i].at {
				t.Fatalf("alarm at %d (%d) before its parent at %d (%d)", i, h[i].at, p, h[p].at)
			}
		}
	}
}

// TestAlarmHeapModel runs random pushes, pops, removals and moves earlier
// against a plain list of the armed alarms.
func TestAlarmHeapModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h alarmHeap
	armed := map[*entry]int64{}
	for step := 0; step < 20000; step++ {
		switch op := rng.IntN(10); {
		case op < 4 || len(h) == 0:
			ent := &entry{heapIdx: -1}
			at := rng.Int64N(1000)
			h.push(ent, at)
			armed[ent] = at
		case op < 6:
			want := slices.Min(slices.Collect(maps.Values(armed)))
			at := h[0].at
			ent := h.pop()
			if at != want || armed[ent] != at || ent.heapIdx != -1 {
				t.Fatalf("step %d: popped %d (entry armed at %d, index %d), want the earliest, %d", step, at, armed[ent], ent.heapIdx, want)
			}
			delete(armed, ent)
		case op < 8:
			ent := h[rng.IntN(len(h))].ent
			h.remove(int(ent.heapIdx))
			if ent.heapIdx != -1 {
				t.Fatalf("step %d: a removed entry keeps index %d", step, ent.heapIdx)
			}
			delete(armed, ent)
		default:
			i := rng.IntN(len(h))
			ent := h[i].ent
			at := h[i].at - rng.Int64N(100)
			h.moveEarlier(i, at)
			armed[ent] = at
		}
		checkAlarms(t, h)
		if len(h) != len(armed) {
			t.Fatalf("step %d: %d alarms in the heap, %d armed", step, len(h), len(armed))
		}
	}
}

// BenchmarkAlarmHeapEvict is what an actor at its bound does on fresh keys:
// it evicts a key (its alarm removed from wherever it is in the heap) and
// arms a new one later than every other, with 32,768 keys (--max-keys
// 131,072 over four actors) spread over memory as a real actor's are.
func BenchmarkAlarmHeapEvict(b *testing.B) {
	const n = 1 << 15
	rng := rand.New(rand.NewPCG(1, 2))
	var h alarmHeap
	ents := make([]*entry, n)
	var at int64
	for i := range ents {
		ents[i] = &entry{heapIdx: -1}
		// Spread the entries: an actor's are allocated among everything else.
		_ = make([]byte, 512)
		at += rng.Int64N(1000)
		h.push(ents[i], at)
	}
	// ents is a ring, oldest first from head: eviction takes one of the
	// oldest (the LRU list is approximate), whose alarm is among the
	// earliest, and the key it makes room for is the newest.
	head := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := (head + rng.IntN(64)) % n
		ents[k], ents[head] = ents[head], ents[k]
		ent := ents[head]
		h.remove(int(ent.heapIdx))
		at += rng.Int64N(1000)
		h.push(ent, at)
		head = (head + 1) % n
	}
}
