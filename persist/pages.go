package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// checkPages reads the page tree of a bbolt file the way bbolt walks it
// when a read-write open rebuilds the freelist (the store does not write
// one, see Open): from the newest valid meta page, every branch, leaf,
// overflow and bucket page, each reached once and below the high-water
// mark. bbolt panics on a goroutine of its own when that walk fails, which
// no recover can catch, so the store walks first and refuses the file.
//
// The layout read here is bbolt's on-disk format (version 2), in the
// machine's byte order as bbolt writes it (little-endian on every platform
// Sluice is built for).
func checkPages(path string) (metaDamage, error) {
	f, err := os.Open(path)
	if err != nil {
		return metaDamage{}, fmt.Errorf("persist: open %s: %v", path, err)
	}
	defer f.Close()
	w := &pageWalker{f: f, path: path}
	m, damage, err := w.meta()
	if err != nil {
		return damage, err
	}
	w.pageSize, w.high = m.pageSize, m.pgid
	w.seen = make(map[uint64]bool)
	if m.freelist != noFreelist {
		if err := w.freelistPage(m.freelist); err != nil {
			return damage, err
		}
	}
	return damage, w.bucket(m.root, nil)
}

// metaDamage describes a meta page that fails its checks while the other
// one is valid (bbolt then opens the file on the valid one, silently).
// page is -1 when both are valid.
type metaDamage struct {
	page     int
	offset   int64
	pageSize uint32
	reason   string
}

func (d metaDamage) String() string {
	return fmt.Sprintf("bbolt meta page %d (bytes %d to %d) is damaged (%s)", d.page, d.offset, d.offset+int64(d.pageSize)-1, d.reason)
}

// bbolt's on-disk constants.
const (
	boltMagic    = 0xED0CDAED
	boltVersion  = 2
	pageHeader   = 16 // id, flags, count, overflow
	elemSize     = 16 // a branch or leaf element
	bucketHeader = 16 // a bucket value: root page, sequence
	pageBranch   = 0x01
	pageLeaf     = 0x02
	pageFreelist = 0x10
	leafBucket   = 0x01
	noFreelist   = ^uint64(0)
	maxTreeDepth = 64
)

type boltMeta struct {
	pageSize       uint32
	root, freelist uint64
	pgid, txid     uint64
}

type pageWalker struct {
	f        *os.File
	path     string
	pageSize uint32
	high     uint64 // pages at or above it are not in use
	seen     map[uint64]bool
	depth    int
	// With all set, a damaged subtree is noted in problems and the walk
	// goes on with the next one (Verify); else the first one ends it.
	all      bool
	problems []error
	// record, if set, is called with each key and value of the top-level
	// bucket named cur (Verify).
	record func(bucket string, k, v []byte)
	cur    string
}

// skip reports whether the walk goes on after err, a damaged subtree,
// noting it.
func (w *pageWalker) skip(err error) bool {
	if w.all {
		w.problems = append(w.problems, err)
	}
	return w.all
}

func (w *pageWalker) corrupt(format string, args ...any) error {
	if w.all {
		return fmt.Errorf(format, args...) // Verify says where
	}
	return formatError(w.path, "corrupt: "+format, args...)
}

// meta returns the newest of the two meta pages that is valid and, if
// only one is, what is wrong with the other.
func (w *pageWalker) meta() (boltMeta, metaDamage, error) {
	none := metaDamage{page: -1}
	buf := make([]byte, pageHeader+64)
	read := func(off int64) (boltMeta, string) {
		if _, err := w.f.ReadAt(buf, off); err != nil && err != io.EOF {
			return boltMeta{}, fmt.Sprintf("cannot be read: %v", err)
		} else if err == io.EOF {
			return boltMeta{}, "cut short"
		}
		return parseMeta(buf[pageHeader:])
	}
	// The first meta page is at offset 0; the second one page further, and
	// the page size is in the first (or, if it is damaged, in the second,
	// found at one of the usual sizes).
	m0, bad0 := read(0)
	pageSize := m0.pageSize
	if bad0 != "" {
		pageSize = 0
		for _, ps := range []int64{4096, 16384, 65536, int64(os.Getpagesize())} {
			if m, bad := read(ps); bad == "" && int64(m.pageSize) == ps {
				pageSize = m.pageSize
				break
			}
		}
		if pageSize == 0 {
			return boltMeta{}, none, w.corrupt("no valid meta page (the first one: %s)", bad0)
		}
	}
	m1, bad1 := read(int64(pageSize))
	switch {
	case bad0 == "" && bad1 == "":
		if m1.txid > m0.txid {
			return m1, none, nil
		}
		return m0, none, nil
	case bad0 != "" && bad1 != "":
		return boltMeta{}, none, w.corrupt("no valid meta page (the first one: %s; the second one: %s)", bad0, bad1)
	case bad0 != "":
		return m1, metaDamage{page: 0, offset: 0, pageSize: pageSize, reason: bad0}, nil
	}
	return m0, metaDamage{page: 1, offset: int64(pageSize), pageSize: pageSize, reason: bad1}, nil
}

// parseMeta reads a meta page's body and checks its magic, version and
// checksum; it returns what is wrong, or "" if nothing is.
func parseMeta(b []byte) (boltMeta, string) {
	le := binary.LittleEndian
	switch {
	case le.Uint32(b) != boltMagic:
		return boltMeta{}, "bad magic number"
	case le.Uint32(b[4:]) != boltVersion:
		return boltMeta{}, fmt.Sprintf("bbolt format version %d; want %d", le.Uint32(b[4:]), boltVersion)
	}
	h := fnv.New64a()
	h.Write(b[:56])
	if h.Sum64() != le.Uint64(b[56:]) {
		return boltMeta{}, "checksum mismatch"
	}
	m := boltMeta{pageSize: le.Uint32(b[8:]), root: le.Uint64(b[16:]), freelist: le.Uint64(b[32:]), pgid: le.Uint64(b[40:]), txid: le.Uint64(b[48:])}
	if m.pageSize < 512 || m.pageSize > 1<<16 {
		return boltMeta{}, fmt.Sprintf("page size %d", m.pageSize)
	}
	return m, ""
}

// read returns page id with its overflow pages, after marking them all
// reached.
func (w *pageWalker) read(id uint64) ([]byte, error) {
	if id < 2 || id >= w.high {
		return nil, w.corrupt("page %d is out of range [2, %d)", id, w.high)
	}
	head := make([]byte, pageHeader)
	if _, err := w.f.ReadAt(head, int64(id)*int64(w.pageSize)); err != nil {
		return nil, w.corrupt("page %d cannot be read: %v", id, err)
	}
	if got := binary.LittleEndian.Uint64(head); got != id {
		return nil, w.corrupt("page %d says it is page %d", id, got)
	}
	overflow := uint64(binary.LittleEndian.Uint32(head[12:]))
	if overflow >= w.high-id {
		return nil, w.corrupt("page %d runs %d pages past the last page in use (%d)", id, overflow, w.high-1)
	}
	for p := id; p <= id+overflow; p++ {
		if w.seen[p] {
			return nil, w.corrupt("page %d is reached twice", p)
		}
		w.seen[p] = true
	}
	b := make([]byte, (overflow+1)*uint64(w.pageSize))
	if _, err := w.f.ReadAt(b, int64(id)*int64(w.pageSize)); err != nil {
		return nil, w.corrupt("page %d cannot be read: %v", id, err)
	}
	return b, nil
}

// freelistPage checks the freelist page id.
func (w *pageWalker) freelistPage(id uint64) error {
	b, err := w.read(id)
	if err != nil {
		return err
	}
	if flags := binary.LittleEndian.Uint16(b[8:]); flags != pageFreelist {
		return w.corrupt("page %d has type %#x; want the freelist", id, flags)
	}
	return nil
}

// bucket walks the tree of a bucket whose root is page root, or its inline
// page when root is 0 (bbolt does not check the key order of those).
func (w *pageWalker) bucket(root uint64, inline []byte) error {
	if w.depth++; w.depth > maxTreeDepth {
		return w.corrupt("trees nested more than %d deep", maxTreeDepth)
	}
	defer func() { w.depth-- }()
	if root != 0 {
		_, err := w.tree(root, nil, nil)
		return err
	}
	_, err := w.elements(0, inline, nil, nil, false)
	return err
}

// tree walks the subtree of page id, whose keys must be >= min and < max
// (nil: unbounded), as bbolt checks them, and returns its largest key.
func (w *pageWalker) tree(id uint64, min, max []byte) ([]byte, error) {
	if w.depth++; w.depth > maxTreeDepth {
		return nil, w.corrupt("trees nested more than %d deep", maxTreeDepth)
	}
	defer func() { w.depth-- }()
	b, err := w.read(id)
	if err != nil {
		return nil, err
	}
	return w.elements(id, b, min, max, true)
}

// elements walks the elements of the branch or leaf page b (id 0: inline),
// checking their keys' order when ordered, and returns the largest key.
func (w *pageWalker) elements(id uint64, b, min, max []byte, ordered bool) ([]byte, error) {
	le := binary.LittleEndian
	if len(b) < pageHeader {
		return nil, w.corrupt("page %d: %d bytes, shorter than its header", id, len(b))
	}
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	if flags != pageBranch && flags != pageLeaf {
		return nil, w.corrupt("page %d has type %#x; want a branch or a leaf", id, flags)
	}
	if pageHeader+count*elemSize > len(b) {
		return nil, w.corrupt("page %d: %d elements do not fit in it", id, count)
	}
	// key returns element i's key, and for a leaf its value.
	key := func(i int) (k, v []byte, err error) {
		e := pageHeader + i*elemSize
		var pos, ksize, vsize uint64
		if flags == pageBranch {
			pos, ksize = uint64(le.Uint32(b[e:])), uint64(le.Uint32(b[e+4:]))
		} else {
			pos, ksize, vsize = uint64(le.Uint32(b[e+4:])), uint64(le.Uint32(b[e+8:])), uint64(le.Uint32(b[e+12:]))
		}
		start := uint64(e) + pos
		if start+ksize+vsize > uint64(len(b)) {
			return nil, nil, w.corrupt("page %d: element %d lies outside the page", id, i)
		}
		return b[start : start+ksize], b[start+ksize : start+ksize+vsize], nil
	}
	prev := min
	var last []byte
	for i := range count {
		k, v, err := key(i)
		if err != nil {
			return nil, err
		}
		if ordered {
			switch {
			case i == 0 && prev != nil && bytes.Compare(prev, k) > 0,
				i > 0 && bytes.Compare(prev, k) >= 0:
				return nil, w.corrupt("page %d: key %d is out of order", id, i)
			case max != nil && bytes.Compare(k, max) >= 0:
				return nil, w.corrupt("page %d: key %d is past its parent's next key", id, i)
			}
		}
		if flags == pageBranch {
			next := max
			if i+1 < count {
				if next, _, err = key(i + 1); err != nil {
					return nil, err
				}
			}
			if last, err = w.tree(le.Uint64(b[pageHeader+i*elemSize+8:]), k, next); err != nil {
				if !w.skip(err) {
					return nil, err
				}
				last = k
			}
			prev = last
			continue
		}
		prev, last = k, k
		if le.Uint32(b[pageHeader+i*elemSize:])&leafBucket == 0 {
			if w.record != nil {
				w.record(w.cur, k, v)
			}
			continue
		}
		if len(v) < bucketHeader {
			return nil, w.corrupt("page %d: bucket %d is %d bytes", id, i, len(v))
		}
		cur := w.cur
		w.cur = string(k)
		err = w.bucket(le.Uint64(v), v[bucketHeader:])
		w.cur = cur
		if err != nil && !w.skip(err) {
			return nil, err
		}
	}
	return last, nil
}
