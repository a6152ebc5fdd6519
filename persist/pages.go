package persist

import (
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
func checkPages(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("persist: open %s: %v", path, err)
	}
	defer f.Close()
	w := &pageWalker{f: f, path: path}
	m, err := w.meta()
	if err != nil {
		return err
	}
	w.pageSize, w.high = m.pageSize, m.pgid
	w.seen = make(map[uint64]bool)
	if m.freelist != noFreelist {
		if err := w.page(m.freelist, pageFreelist); err != nil {
			return err
		}
	}
	return w.bucket(m.root, nil)
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
}

func (w *pageWalker) corrupt(format string, args ...any) error {
	return formatError(w.path, "corrupt: "+format, args...)
}

// meta returns the newest of the two meta pages that is valid.
func (w *pageWalker) meta() (boltMeta, error) {
	var best boltMeta
	found := false
	buf := make([]byte, pageHeader+64)
	// The first meta page is at offset 0; the second one page further, and
	// the page size is in the first (or, if it is damaged, one of the
	// usual sizes).
	offsets := []int64{0}
	if _, err := w.f.ReadAt(buf, 0); err == nil {
		if ps := binary.LittleEndian.Uint32(buf[pageHeader+8:]); ps >= 512 && ps <= 1<<16 {
			offsets = append(offsets, int64(ps))
		}
	}
	for _, ps := range []int64{4096, 16384, 65536} {
		offsets = append(offsets, ps)
	}
	for _, off := range offsets {
		if _, err := w.f.ReadAt(buf, off); err != nil && err != io.EOF {
			continue
		}
		m, ok := parseMeta(buf[pageHeader:])
		if ok && (!found || m.txid > best.txid) {
			best, found = m, true
		}
	}
	if !found {
		return best, w.corrupt("no valid meta page")
	}
	return best, nil
}

// parseMeta reads a meta page's body and checks its magic, version and
// checksum.
func parseMeta(b []byte) (boltMeta, bool) {
	le := binary.LittleEndian
	if le.Uint32(b) != boltMagic || le.Uint32(b[4:]) != boltVersion {
		return boltMeta{}, false
	}
	h := fnv.New64a()
	h.Write(b[:56])
	if h.Sum64() != le.Uint64(b[56:]) {
		return boltMeta{}, false
	}
	return boltMeta{pageSize: le.Uint32(b[8:]), root: le.Uint64(b[16:]), freelist: le.Uint64(b[32:]), pgid: le.Uint64(b[40:]), txid: le.Uint64(b[48:])}, true
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

// page walks page id, which must be of type want (branch or leaf both
// pass for pageBranch|pageLeaf).
func (w *pageWalker) page(id uint64, want uint16) error {
	b, err := w.read(id)
	if err != nil {
		return err
	}
	flags := binary.LittleEndian.Uint16(b[8:])
	if flags&want == 0 {
		return w.corrupt("page %d has type %#x; want %#x", id, flags, want)
	}
	if flags == pageFreelist {
		return nil
	}
	return w.nodes(id, b)
}

// bucket walks the tree of a bucket whose root is page root, or its inline
// page when root is 0.
func (w *pageWalker) bucket(root uint64, inline []byte) error {
	if w.depth++; w.depth > maxTreeDepth {
		return w.corrupt("trees nested more than %d deep", maxTreeDepth)
	}
	defer func() { w.depth-- }()
	if root == 0 {
		return w.nodes(0, inline)
	}
	return w.page(root, pageBranch|pageLeaf)
}

// nodes walks the elements of a branch or leaf page b (id 0: inline).
func (w *pageWalker) nodes(id uint64, b []byte) error {
	le := binary.LittleEndian
	if len(b) < pageHeader {
		return w.corrupt("page %d: %d bytes, shorter than its header", id, len(b))
	}
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	if pageHeader+count*elemSize > len(b) {
		return w.corrupt("page %d: %d elements do not fit in it", id, count)
	}
	for i := range count {
		e := pageHeader + i*elemSize
		switch flags {
		case pageBranch:
			if err := w.bucketPage(le.Uint64(b[e+8:])); err != nil {
				return err
			}
		case pageLeaf:
			if le.Uint32(b[e:])&leafBucket == 0 {
				continue
			}
			pos, ksize, vsize := uint64(le.Uint32(b[e+4:])), uint64(le.Uint32(b[e+8:])), uint64(le.Uint32(b[e+12:]))
			start := uint64(e) + pos + ksize
			if vsize < bucketHeader || start+vsize > uint64(len(b)) {
				return w.corrupt("page %d: bucket %d lies outside the page", id, i)
			}
			v := b[start : start+vsize]
			root := le.Uint64(v)
			if err := w.bucket(root, v[bucketHeader:]); err != nil {
				return err
			}
		default:
			return w.corrupt("page %d has type %#x; want a branch or a leaf", id, flags)
		}
	}
	return nil
}

// bucketPage walks a child page of a branch.
func (w *pageWalker) bucketPage(id uint64) error {
	if w.depth++; w.depth > maxTreeDepth {
		return w.corrupt("trees nested more than %d deep", maxTreeDepth)
	}
	defer func() { w.depth-- }()
	return w.page(id, pageBranch|pageLeaf)
}
