package persist

import "hash/maphash"

// table is the overlay's index: key → entry, an open-addressing hash table
// with linear probing. A lookup touches one slot (a hash and a pointer,
// four to a cache line) and then the entry, where the key is compared;
// a Go map would touch a control word, a slot holding the key, then the
// entry. Entries are only added (a deletion is an entry too) until the
// whole table is cleared, so it needs no tombstones.
//
// Its concurrency is the overlay's: written by the writer goroutine under
// Store.ovMu, read under it by others.
type table struct {
	seed  maphash.Seed
	slots []slot // a power of two of them
	n     int    // entries
}

type slot struct {
	hash uint64
	e    *entry
}

const minTableSlots = 64

func newTable() table {
	return table{seed: maphash.MakeSeed(), slots: make([]slot, minTableSlots)}
}

// len returns the number of entries.
func (t *table) len() int { return t.n }

// get returns the entry of key, or nil.
func (t *table) get(key string) *entry {
	h := maphash.String(t.seed, key)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.e == nil {
			return nil
		}
		if s.hash == h && s.e.key == key {
			return s.e
		}
	}
}

// warm loads the home slot of key and the entry there, and returns a value
// read from them, for the caller to keep (so that the loads happen).
func (t *table) warm(key string) int64 {
	s := &t.slots[maphash.String(t.seed, key)&uint64(len(t.slots)-1)]
	if s.e == nil {
		return 0
	}
	return s.e.deadline
}

// getBytes is get for a key held in a byte slice.
func (t *table) getBytes(key []byte) *entry {
	h := maphash.Bytes(t.seed, key)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.e == nil {
			return nil
		}
		if s.hash == h && s.e.key == string(key) {
			return s.e
		}
	}
}

// add adds e, whose key the table does not hold.
func (t *table) add(e *entry) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	t.place(maphash.String(t.seed, e.key), e)
	t.n++
}

func (t *table) place(h uint64, e *entry) {
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for t.slots[i].e != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = slot{h, e}
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, 2*len(old))
	for _, s := range old {
		if s.e != nil {
			t.place(s.hash, s.e)
		}
	}
}

// each calls fn for every entry, in no order.
func (t *table) each(fn func(*entry)) {
	for _, s := range t.slots {
		if s.e != nil {
			fn(s.e)
		}
	}
}

// clear removes every entry and keeps the room.
func (t *table) clear() {
	clear(t.slots)
	t.n = 0
}
