package persist

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// compactTxBytes bounds the keys and values one transaction of a compaction
// copies, and so its memory.
const compactTxBytes = 4 << 20

// compactRetry is how long a compaction that failed is not tried again.
const compactRetry = time.Minute

// compactName is the file a compaction writes, next to the data file, and
// renames over it when complete. Open removes one a crash left.
func compactName(path string) string { return path + ".compact" }

// boltOptions returns the options of the data file's read-write handle.
//
// NoSync: in ModeCommit and ModeAsync a commit is write(2) without fsync.
// NoFreelistSync: the freelist is not written by every commit (fewer pages
// per transaction); Open rebuilds it by walking the file instead.
// FreelistMapType: O(1) page allocation however fragmented the file.
// InitialMmapSize: address space, not memory; a file that grows within
// it is not remapped, and a remap in the middle of a checkpoint copies
// every node the transaction has touched to the heap.
func boltOptions(o Options) *bolt.Options {
	return &bolt.Options{
		Timeout:         o.OpenTimeout,
		NoSync:          o.Mode != ModeFsync,
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: initialMmapSize,
	}
}

// maybeCompact compacts the data file when its free pages pass
// Options.CompactMinFree and outnumber the pages in use. It runs on the
// checkpointer, after a checkpoint or a Sweep pass: the only goroutine that
// writes the file, besides the meta records, which wait for it.
//
// A file whose records expired keeps its size: bbolt reuses free pages but
// never gives them back. Compacting copies the records (the keys bucket,
// the index and the meta buckets, in key order, pages full) into a new file
// in transactions of compactTxBytes, syncs it, renames it over the data
// file and syncs the directory, then reads go to the new file. A crash
// before the rename leaves the old file whole (Open removes the partial
// copy); after it, the new one. While the copy runs, reads go on; a
// checkpoint that falls due waits for it, and the commits after it wait
// for that checkpoint: the copy costs about its size at the disk's
// sequential speed.
func (c *checkpointer) maybeCompact() {
	s := c.s
	if s.opts.CompactMinFree < 0 || time.Now().Before(c.compactAfter) {
		return
	}
	var size int64
	if err := s.db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		return
	}
	st := s.db.Stats()
	free := int64(st.FreePageN+st.PendingPageN) * int64(s.db.Info().PageSize)
	if free < s.opts.CompactMinFree || free < size-free {
		return
	}
	if err := c.compact(size); err != nil {
		c.compactAfter = time.Now().Add(compactRetry)
		s.log.Warn("cannot compact the data file; trying again in a minute at the earliest", "err", err, "bytes", size, "free_bytes", free)
	}
}

// compact copies the data file into a new one and replaces it.
func (c *checkpointer) compact(before int64) error {
	s := c.s
	path := s.opts.Path
	tmp := compactName(path)
	start := time.Now()
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("persist: compact %s: remove %s: %v", path, tmp, err)
	}
	dst, err := bolt.Open(tmp, 0o600, boltOptions(s.opts))
	if err != nil {
		return fmt.Errorf("persist: compact %s: create %s: %v", path, tmp, err)
	}
	abandon := func(err error) error {
		_ = dst.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("persist: compact %s: %v (the data file is unchanged)", path, err)
	}
	s.metaMu.Lock() // a meta record written to the old file now would be lost
	defer s.metaMu.Unlock()
	if err := bolt.Compact(dst, s.db, compactTxBytes); err != nil {
		return abandon(err)
	}
	if err := seal(dst); err != nil { // see seal.go
		return abandon(err)
	}
	if err := dst.Sync(); err != nil {
		return abandon(err)
	}
	var after int64
	if err := dst.View(func(tx *bolt.Tx) error { after = tx.Size(); return nil }); err != nil {
		return abandon(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return abandon(err)
	}
	// From here on the new file is the data file, if the directory says
	// so after a power loss; if syncing it fails, both files hold the same
	// records, and the store goes on with the new one.
	if err := syncDir(filepath.Dir(path)); err != nil {
		s.log.Warn("cannot sync the data dir after compacting", "err", err)
	}
	s.dbMu.Lock()
	old := s.db
	s.db = dst
	s.dbMu.Unlock()
	if err := old.Close(); err != nil {
		s.log.Warn("closing the data file before its compaction", "err", err)
	}
	d := time.Since(start)
	s.log.Info("compacted the data file", "bytes_before", before, "bytes_after", after, "duration", d)
	if s.opts.OnCompact != nil {
		s.opts.OnCompact(before, after, d)
	}
	return nil
}
