package persist

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Sealing makes bbolt's two meta pages redundant copies of every write the
// store acknowledges, so that a damaged meta page costs nothing.
//
// bbolt writes transaction t's meta page at page t%2 and, on open, takes
// the newest of the two that is valid: when the newest is damaged, it
// starts on the one before, silently, and whatever the newest transaction
// wrote is gone (with the WAL files it replaced, after a checkpoint). So
// every write whose loss would matter (the last transaction of a
// checkpoint or a replay, a Sweep's, a meta record's, the initialisation
// of a file, a compacted copy) is followed by a seal, a transaction that
// only records its own ID under keySeal, before the write is
// acknowledged, before the WAL files it replaces are removed. Then the
// two newest meta pages are a write and its seal (or a seal and a write
// not acknowledged yet), and either one holds every acknowledged write:
// whichever is damaged, the other one loses nothing. (A checkpoint's
// transactions before its last are not sealed: the WAL files it writes
// are kept until its end, and a replay restores what they held.)
//
// On open, a file with one damaged meta page is accepted only if the valid
// one's tree proves it: it holds keySeal equal to its own transaction ID
// (it is a seal) or to the ID before (it is the write just after a seal,
// and the damaged page is that write's seal or a write nobody was told
// of). A file that says neither, such as one last written by a build
// without seals, is refused with ErrFormat, naming the page. The first
// write after the open rewrites the damaged page.

// keySeal, in the meta bucket, holds the ID of the last seal transaction,
// an 8-byte big-endian number.
var keySeal = []byte("seal")

// seal commits a transaction that records its own ID under keySeal.
func seal(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("no %q bucket", bucketMeta)
		}
		return meta.Put(keySeal, binary.BigEndian.AppendUint64(nil, uint64(tx.ID())))
	})
}

// sealed reports whether the tree tx reads proves that it holds every
// write acknowledged before its meta page's neighbour was damaged (see
// above).
func sealed(tx *bolt.Tx) bool {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return false
	}
	v := meta.Get(keySeal)
	if len(v) != 8 {
		return false
	}
	s, id := binary.BigEndian.Uint64(v), uint64(tx.ID())
	return s == id || s+1 == id
}
