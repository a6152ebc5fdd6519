package persist

// entry is the latest committed record of one key in an overlay: a put
// (deadline > 0, value), a tail (deadline > 0, bytes appended to the value
// beneath the overlay) or a deletion.
//
// A tail saves copying a long value into the overlay for an append of a
// few bytes: the key's value is the value beneath the overlay, baseLen
// bytes, followed by value. Beneath the current overlay is the frozen one
// if it holds the key, else the data file; beneath the frozen overlay is
// the data file. That value does not change while the tail is in the
// overlay: the frozen overlay is read-only, a Sweep leaves the data file's
// records of keys the overlays hold, and only the checkpoint of the frozen
// overlay rewrites them, with the very value the current overlay's tails go
// after (Get tells whether it read the record before or after: see
// tailRead.join).
//
// key, deadline, del, tail, baseLen and value are written by the writer
// goroutine only, under Store.ovMu, and only while the overlay is the
// current one; Get reads them holding ovMu for reading; the checkpointer
// reads them once the overlay is frozen. heaped, ver and low are the
// writer's alone.
type entry struct {
	key      string
	deadline int64  // 0 for a deletion
	value    []byte // the value, or the tail; its array is reused by the next put of the key
	del      bool
	tail     bool   // value goes after the value beneath the overlay
	heaped   bool   // the heap holds a current item for the entry
	ver      uint32 // the version of that item
	low      int64  // its deadline, <= deadline

	// small holds a value that fits, so that writing it touches no other
	// memory than the entry.
	small [inlineValue]byte

	baseLen uint32 // for a tail, the length of the value beneath (< MaxValueLen)
}

// inlineValue is the size of entry.small: an entry is then two cache lines.
const inlineValue = 60

// size returns the length of e's whole value.
func (e *entry) size() int { return int(e.baseLen) + len(e.value) }

// heapItem is a deadline in an overlay's heap: while it is current (no
// item was pushed for its entry since, see ver), a lower bound of its
// entry's deadline if the entry is a put. A put that moves a key's deadline
// later, or a deletion, leaves the item alone (the heap is not touched); a
// put that moves it earlier pushes a new item, and the old one is left
// behind, not current. An item that reaches the top is popped if it is not
// current or its entry is a deletion, or pushed again at its entry's
// deadline if that is later. So a key costs the heap about one push and one
// pop per deadline that passes, however often it is written, and the heap
// holds about one item per key.
type heapItem struct {
	deadline int64
	e        *entry
	ver      uint32
}

func (it heapItem) current() bool { return it.e.ver == it.ver }

// overlay holds the records committed to the WAL since the last checkpoint
// (the current overlay) or being checkpointed (the frozen one): one entry
// per key, the latest, deletions included.
type overlay struct {
	m table

	// heap is a 4-ary min-heap of the deadlines of the puts of m, for
	// NextDeadline and Sweep; see heapItem. The writer's alone.
	heap []heapItem

	free []*entry // entries of a recycled overlay, for reuse

	bytes   int64  // WAL bytes written into it, frame headers included
	mem     int64  // what its entries cost in memory, roughly: see entryMem
	toGen   uint64 // the WAL generation of its last records
	lastSeq uint64 // the sequence number of its last frame
	// gen is, for the writer's overlays, the WAL generation of their
	// records, set before Get can see them (see tailRead.join).
	gen uint64
}

func newOverlay() *overlay {
	return &overlay{m: newTable()}
}

// keyOf returns the key string of an existing entry for k, or a new string.
func (o *overlay) keyOf(k []byte) string {
	if e := o.m.getBytes(k); e != nil {
		return e.key
	}
	return string(k)
}

// entryOverhead is what an entry costs an overlay besides its key and a
// value too long for entry.small: the entry (128 bytes), its table slot
// (16 bytes, at a load of a half to a quarter) and its heap item (24 bytes).
const entryOverhead = 128 + 2*16 + 24

// entryMem is what e costs its overlay: entryOverhead, its key (which the
// caller's copy may share; counted anyway) and its value's array when that
// is not e.small.
func entryMem(e *entry) int64 {
	n := int64(entryOverhead + len(e.key))
	if c := cap(e.value); c > inlineValue {
		n += int64(c)
	}
	return n
}

// put records a put of key; value is copied.
func (o *overlay) put(key string, deadline int64, value []byte) {
	e := o.m.get(key)
	if e == nil {
		e = o.newEntry(key)
	}
	before := cap(e.value)
	if len(value) <= inlineValue && cap(e.value) <= inlineValue {
		e.value = append(e.small[:0], value...)
	} else {
		e.value = append(e.value[:0], value...)
	}
	o.grew(e, before)
	e.del, e.tail, e.baseLen = false, false, 0
	o.setDeadline(e, deadline)
}

// grew accounts for e's value array, whose capacity was before.
func (o *overlay) grew(e *entry, before int) {
	if after := cap(e.value); after != before {
		o.mem += int64(max(after, inlineValue) - max(before, inlineValue))
	}
}

// appendTo records an append of value to the value of key, whose entry in
// o is e (nil if o holds none), and sets the key's deadline: value is added
// to e's value if e is a put or a tail; to base (nil: none, value alone) if
// o holds no entry; to nothing after a deletion. If the result would be
// longer than limit bytes, value alone is stored and appendTo returns false.
// value and base are copied.
//
// Appending to a put grows its array in place, geometrically (Go's append):
// the appends of a key between two puts cost amortized O(len(value)) each. An
// entry's value may thus move from e.small to a heap array; the next put
// keeps using that array, as it does for a long value.
func (o *overlay) appendTo(e *entry, key string, deadline int64, value, base []byte, limit int) (ok bool) {
	ok = true
	if e != nil {
		defer o.grew(e, cap(e.value))
	}
	switch {
	case e == nil:
		e = o.newEntry(key)
		defer o.grew(e, cap(e.value))
	case e.del:
		base = nil
	case e.size()+len(value) <= limit:
		e.value = append(e.value, value...)
		o.setDeadline(e, deadline)
		return true
	default:
		base, ok = nil, false
	}
	if len(base)+len(value) > limit {
		base, ok = nil, false
	}
	if len(base)+len(value) <= inlineValue && cap(e.value) <= inlineValue {
		e.value = append(append(e.small[:0], base...), value...)
	} else {
		e.value = append(append(e.value[:0], base...), value...)
	}
	e.del, e.tail, e.baseLen = false, false, 0
	o.setDeadline(e, deadline)
	return ok
}

// appendTail records an append of value to key, which o holds no entry of,
// over a value of baseLen bytes beneath o: a tail (see entry). If the whole
// value would be longer than limit bytes, value alone is stored and
// appendTail returns false. value is copied.
func (o *overlay) appendTail(key string, deadline int64, value []byte, baseLen, limit int) bool {
	e := o.newEntry(key)
	before := cap(e.value)
	ok := baseLen+len(value) <= limit
	// Not in the array a recycled entry may bring: it was sized for a
	// whole value, which a tail seldom grows to, and the overlay counts
	// its capacity.
	e.value = append(e.small[:0:inlineValue], value...)
	o.grew(e, before)
	if ok {
		e.tail, e.baseLen = true, uint32(baseLen)
	}
	o.setDeadline(e, deadline)
	return ok
}

// setDeadline sets the deadline of e, a put, and pushes a heap item if the
// deadline moved earlier than the entry's current item (see heapItem).
func (o *overlay) setDeadline(e *entry, deadline int64) {
	if !e.heaped || deadline < e.low {
		e.ver++
		e.heaped = true
		e.low = deadline
		o.push(heapItem{deadline, e, e.ver})
	}
	e.deadline = deadline
}

// del records a deletion of key.
func (o *overlay) del(key string) {
	e := o.m.get(key)
	if e == nil {
		e = o.newEntry(key)
	}
	e.value = e.value[:0]
	e.del, e.tail, e.baseLen = true, false, 0
	e.deadline = 0
}

func (o *overlay) newEntry(key string) *entry {
	var e *entry
	if n := len(o.free); n > 0 {
		e = o.free[n-1]
		o.free[n-1] = nil
		o.free = o.free[:n-1]
		v := e.value[:0]
		if cap(v) <= inlineValue {
			v = nil // e.small
		}
		*e = entry{key: key, value: v, ver: e.ver}
	} else {
		e = &entry{key: key}
	}
	o.m.add(e)
	o.mem += entryMem(e)
	return e
}

// settle pops the top items that are not current or whose entry is a
// deletion, and pushes again at their entry's deadline those whose entry
// moved later, until the top is exact or the heap empty. skip, if not nil,
// drops items of other keys too (for the frozen overlay: keys the current
// one holds).
func (o *overlay) settle(skip func(key string) bool) (heapItem, bool) {
	for len(o.heap) > 0 {
		it := o.heap[0]
		e := it.e
		switch {
		case !it.current():
			o.pop()
		case e.del || skip != nil && skip(e.key):
			o.pop()
			e.heaped = false
		case e.deadline > it.deadline:
			o.pop()
			it.deadline = e.deadline
			e.low = it.deadline
			o.push(it)
		default:
			return it, true
		}
	}
	return heapItem{}, false
}

// recycle empties o for reuse as a new overlay, keeping its map's and its
// heap's room and its entries (with their value arrays). No goroutine may
// read it any more.
func (o *overlay) recycle() {
	o.m.each(func(e *entry) {
		e.key = ""
		o.free = append(o.free, e)
	})
	o.m.clear()
	clear(o.heap)
	o.heap = o.heap[:0]
	o.bytes, o.toGen, o.lastSeq, o.mem = 0, 0, 0, 0
}

// top returns the item with the earliest deadline, current or not.
func (o *overlay) top() (heapItem, bool) {
	if len(o.heap) == 0 {
		return heapItem{}, false
	}
	return o.heap[0], true
}

func (o *overlay) push(it heapItem) {
	h := append(o.heap, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if h[p].deadline <= it.deadline {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = it
	o.heap = h
}

func (o *overlay) pop() heapItem {
	h := o.heap
	top := h[0]
	last := len(h) - 1
	it := h[last]
	h[last] = heapItem{}
	h = h[:last]
	o.heap = h
	if last == 0 {
		return top
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= last {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < last; j++ {
			if h[j].deadline < h[m].deadline {
				m = j
			}
		}
		if it.deadline <= h[m].deadline {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = it
	return top
}
