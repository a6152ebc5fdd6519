package topk

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
)

// Sketch is a space-saving sketch: at most Capacity counters, the smallest
// of which a new key takes over when all are taken.
type Sketch struct {
	seed  maphash.Seed
	slab  []counter   // the counters, allocated once
	heap  []heapEntry // min-heap by count over slab[:len(heap)]
	table []int32     // open addressing over the keys: 1 + index in slab, 0 for empty
	shift uint        // 64 − log2(len(table))
	total uint64
}

type counter struct {
	key  string
	hash uint64
	err  uint64
	pos  int32 // index in heap
}

// heapEntry keeps the count next to the heap's order, so that sifting
// reads one array.
type heapEntry struct {
	count uint64
	c     int32 // index in slab
}

// New returns a sketch of capacity counters (at least 1).
func New(capacity int) *Sketch {
	capacity = max(capacity, 1)
	bits := uint(bits.Len(uint(2*capacity - 1))) // a table at most half full
	return &Sketch{
		seed:  maphash.MakeSeed(),
		slab:  make([]counter, capacity),
		heap:  make([]heapEntry, 0, capacity),
		table: make([]int32, 1<<bits),
		shift: 64 - bits,
	}
}

// Capacity is the most counters the sketch keeps.
func (s *Sketch) Capacity() int { return len(s.slab) }

// Total is the weight added since New or Reset.
func (s *Sketch) Total() uint64 { return s.total }

// Add counts weight w for key. The sketch keeps key (it does not copy it).
func (s *Sketch) Add(key string, w uint64) { s.AddHashed(key, maphash.String(s.seed, key), w) }

// AddHashed is Add for a caller that hashed key already: hash must be the
// same for the same key every time (any good 64-bit hash).
func (s *Sketch) AddHashed(key string, hash, w uint64) {
	s.total += w
	slot := s.find(key, hash)
	if c := s.table[slot]; c != 0 {
		pos := s.slab[c-1].pos
		s.heap[pos].count += w
		s.down(int(pos))
		return
	}
	if n := len(s.heap); n < len(s.slab) {
		s.slab[n] = counter{key: key, hash: hash, pos: int32(n)}
		s.heap = append(s.heap, heapEntry{count: w, c: int32(n)})
		s.table[slot] = int32(n + 1)
		s.up(n)
		return
	}
	// Take over the smallest counter.
	top := &s.heap[0]
	c := &s.slab[top.c]
	s.remove(s.find(c.key, c.hash))
	c.key, c.hash, c.err = key, hash, top.count
	top.count += w
	s.table[s.find(key, hash)] = top.c + 1 // the removal may have moved key's slot
	s.down(0)
}

// home is where hash starts probing (Fibonacci hashing: the top bits of a
// multiplication, so that hashes alike in their low bits spread).
func (s *Sketch) home(hash uint64) int { return int((hash * 0x9e3779b97f4a7c15) >> s.shift) }

// find returns the slot of key in the table, or the empty slot where it
// would go.
func (s *Sketch) find(key string, hash uint64) int {
	mask := len(s.table) - 1
	for i := s.home(hash); ; i = (i + 1) & mask {
		c := s.table[i]
		if c == 0 {
			return i
		}
		if e := &s.slab[c-1]; e.hash == hash && e.key == key {
			return i
		}
	}
}

// remove empties slot i, moving back the entries after it that probed past
// it (backward-shift deletion).
func (s *Sketch) remove(i int) {
	mask := len(s.table) - 1
	for j := (i + 1) & mask; s.table[j] != 0; j = (j + 1) & mask {
		k := s.home(s.slab[s.table[j]-1].hash)
		// The entry at j may move to i when its home is not cyclically in
		// (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			s.table[i] = s.table[j]
			i = j
		}
	}
	s.table[i] = 0
}

// Reset forgets every count, keeping the memory.
func (s *Sketch) Reset() {
	for i := range s.heap {
		s.slab[i] = counter{} // let the key go
	}
	clear(s.table)
	s.heap = s.heap[:0]
	s.total = 0
}

// floor is the most a key without a counter can have been counted: the
// smallest count once every counter is taken, 0 before.
func (s *Sketch) floor() uint64 {
	if len(s.heap) < len(s.slab) {
		return 0
	}
	return s.heap[0].count
}

// Summary returns the sketch's counters, largest first.
func (s *Sketch) Summary() Summary {
	sum := Summary{Entries: make([]Entry, len(s.heap)), Floor: s.floor(), Total: s.total}
	for i, h := range s.heap {
		c := &s.slab[h.c]
		sum.Entries[i] = Entry{Key: c.key, Count: h.count, Err: c.err}
	}
	sum.sort()
	return sum
}

func (s *Sketch) up(i int) {
	h := s.heap
	for i > 0 {
		p := (i - 1) / 2
		if h[p].count <= h[i].count {
			break
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	h := s.heap
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].count < h[l].count {
			m = r
		}
		if h[i].count <= h[m].count {
			return
		}
		s.swap(i, m)
		i = m
	}
}

func (s *Sketch) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	s.slab[h[i].c].pos, s.slab[h[j].c].pos = int32(i), int32(j)
}

// Entry is a key's count in a Summary: its true count is in
// [Count−Err, Count].
type Entry struct {
	Key        string
	Count, Err uint64
}

// Summary is what a stream counted, as far as a sketch can tell: the
// listed keys with bounds on their counts, largest first (ties by key), and
// Floor, the most any key that is not listed was counted. Total is the
// stream's whole weight.
type Summary struct {
	Entries []Entry
	Floor   uint64
	Total   uint64
}

func (s *Summary) sort() {
	slices.SortFunc(s.Entries, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}

// Truncate returns the n largest entries of s (all if n < 0), raising
// Floor to the largest count it drops, so that the bounds still hold.
func (s Summary) Truncate(n int) Summary {
	if n < 0 || len(s.Entries) <= n {
		return s
	}
	return Summary{Entries: s.Entries[:n:n], Floor: max(s.Floor, s.Entries[n].Count), Total: s.Total}
}

// Merge combines summaries of disjoint parts of a stream into a summary of
// the whole. A key missing from a part counts that part's Floor in its
// count and in its error; the merged Floor is the sum of the parts'.
func Merge(parts ...Summary) Summary {
	var out Summary
	// For each key: the sum of its counts, of its lower bounds, and of the
	// floors of the parts that list it.
	type bounds struct{ count, low, floors uint64 }
	keys := make(map[string]*bounds)
	for _, p := range parts {
		out.Total += p.Total
		out.Floor += p.Floor
		for _, e := range p.Entries {
			b, ok := keys[e.Key]
			if !ok {
				b = &bounds{}
				keys[e.Key] = b
			}
			b.count += e.Count
			b.low += e.Count - min(e.Err, e.Count)
			b.floors += p.Floor
		}
	}
	out.Entries = make([]Entry, 0, len(keys))
	for k, b := range keys {
		// The floors of the parts that do not list the key.
		count := b.count + out.Floor - min(b.floors, out.Floor)
		out.Entries = append(out.Entries, Entry{Key: k, Count: count, Err: count - min(b.low, count)})
	}
	out.sort()
	return out
}
