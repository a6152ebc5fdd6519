package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// expiryFillPercent is how full bbolt leaves the pages of the expiry index
// it splits (its default, for random inserts, is 0.5).
const expiryFillPercent = 0.9

// emptyValue is the value of every expiry index entry, and what Get passes
// for an empty value.
var emptyValue = []byte{}

// checkpointer is the goroutine that writes to bbolt: frozen overlays
// (checkpoints) and the bbolt part of Sweep passes. It runs one job at a
// time, checkpoints first; the writer goroutine hands it jobs and never
// waits for bbolt, except when a checkpoint is due while the previous one
// still runs.
type checkpointer struct {
	s *Store

	mu     sync.Mutex
	ckpt   *overlay      // a checkpoint to run
	sweeps []sweepJob    // bbolt sweeps to run, in order
	stop   bool          // Close: abandon sweeps, exit when idle
	wake   chan struct{} // capacity 1
	done   chan struct{} // closed when the goroutine returns

	// swept is the id of the last Sweep pass finished (done, failed or
	// abandoned), set before its Sweep calls are finished: the writer reads
	// it to know that no pass may still delete a record it reads.
	swept atomic.Uint64

	// oldest is the oldest WAL generation that may still exist: the
	// files from oldest up to a checkpoint's generation are removed after it.
	oldest uint64

	bw bboltWriter // used by one goroutine at a time: this one, then the writer's Close

	// compactAfter is when a compaction that failed may be tried again.
	compactAfter time.Time

	// beforeCommit, if set (by tests), runs at the end of every checkpoint
	// transaction; an error fails it.
	beforeCommit func(*bolt.Tx) error
	// afterWrite, if set (by tests), runs once a checkpoint is in the data
	// file, before the writer learns of it and drops its overlay.
	afterWrite func()
}

// sweepJob is the bbolt part of a Sweep pass.
type sweepJob struct {
	id       uint64 // the writer's count of passes handed over
	now      int64
	budget   int
	sweepers []*Commit
}

// ckResult is the outcome of a checkpoint, sent to the writer.
type ckResult struct {
	ov  *overlay
	err error
}

func (c *checkpointer) init(s *Store, oldest uint64) {
	c.s = s
	c.oldest = oldest
	c.wake = make(chan struct{}, 1)
	c.done = make(chan struct{})
}

func (c *checkpointer) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// checkpoint hands ov to the goroutine; its result goes to Store.ckDone.
func (c *checkpointer) checkpoint(ov *overlay) {
	c.mu.Lock()
	c.ckpt = ov
	c.mu.Unlock()
	c.signal()
}

// sweep queues the bbolt part of a Sweep pass; it joins a queued one.
func (c *checkpointer) sweep(j sweepJob) {
	c.mu.Lock()
	if n := len(c.sweeps); n > 0 {
		last := &c.sweeps[n-1]
		last.id = j.id
		last.now = max(last.now, j.now)
		last.sweepers = append(last.sweepers, j.sweepers...)
	} else {
		c.sweeps = append(c.sweeps, j)
	}
	c.mu.Unlock()
	c.signal()
}

// shutdown stops the goroutine once it is idle, abandoning Sweep passes
// with ErrClosed, and waits for it. No checkpoint may be under way.
func (c *checkpointer) shutdown() {
	c.mu.Lock()
	c.stop = true
	c.mu.Unlock()
	c.signal()
	<-c.done
}

func (c *checkpointer) stopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stop
}

// run is the checkpointer goroutine: run the checkpoint handed over, else
// the oldest Sweep pass queued, else sleep until signalled; return once
// stopped and idle.
func (c *checkpointer) run() {
	defer close(c.done)
	for {
		c.mu.Lock()
		ov, stop := c.ckpt, c.stop
		var j sweepJob
		hasSweep := false
		switch {
		case ov != nil:
			c.ckpt = nil
		case len(c.sweeps) > 0:
			j, hasSweep = c.sweeps[0], true
			c.sweeps[0] = sweepJob{}
			c.sweeps = c.sweeps[1:]
		}
		c.mu.Unlock()
		switch {
		case ov != nil:
			err := c.write(ov)
			if err == nil {
				c.removeWALs(ov.toGen)
				if c.afterWrite != nil {
					c.afterWrite()
				}
			}
			c.s.ckDone <- ckResult{ov, err}
			if err == nil {
				c.maybeCompact()
			}
		case hasSweep && stop:
			c.finishSweep(j, c.s.errClosed)
		case hasSweep:
			c.runSweep(j)
		case stop:
			return
		default:
			<-c.wake
		}
	}
}

// write writes ov into bbolt in one transaction and reports to
// OnCheckpoint. The WAL files ov came from can go once it returns nil (and,
// for a graceful Close in ModeCommit, once the file is synced).
func (c *checkpointer) write(ov *overlay) error {
	s := c.s
	start := time.Now()
	next, empty, err := c.bw.writeOverlay(s.db, ov, false, c.beforeCommit)
	d := time.Since(start)
	if s.opts.OnCheckpoint != nil {
		s.opts.OnCheckpoint(ov.m.len(), d, err)
	}
	if err != nil {
		err = fmt.Errorf("persist: checkpoint to %s: %v (the records stay in the WAL and in memory; check the disk)", s.opts.Path, err)
		s.log.Error("checkpoint failed", "records", ov.m.len(), "err", err)
		return err
	}
	s.dbEmpty.Store(empty)
	s.setDBNext(next)
	s.log.Debug("checkpoint", "records", ov.m.len(), "wal_bytes", ov.bytes, "gen", ov.toGen, "duration", d)
	return nil
}

// removeWALs removes the WAL files up to generation gen, all in bbolt now.
// A file that cannot be removed is tried again after the next checkpoint;
// meanwhile, the generation recorded in the data file tells Open to ignore
// it.
func (c *checkpointer) removeWALs(gen uint64) {
	for ; c.oldest <= gen; c.oldest++ {
		if err := removeWAL(walName(c.s.opts.Path, c.oldest)); err != nil {
			c.s.log.Warn("cannot remove a checkpointed WAL file", "err", err)
			return
		}
	}
}

// runSweep deletes expired records from bbolt, budget per transaction,
// until none is left or Close stops it, then finishes the Sweep calls.
func (c *checkpointer) runSweep(j sweepJob) {
	s := c.s
	c.bw.sweptNow = max(c.bw.sweptNow, j.now)
	for {
		var (
			deleted int
			done    bool
			next    int64
			empty   bool
		)
		err := s.db.Update(func(tx *bolt.Tx) error {
			keys, exp := tx.Bucket(bucketKeys), tx.Bucket(bucketExpiry)
			var err error
			if deleted, done, err = sweepBolt(keys, exp, j.now, j.budget, s.inOverlay); err != nil {
				return err
			}
			next = firstDeadline(exp)
			empty = isEmpty(keys)
			return nil
		})
		if err == nil && deleted > 0 {
			err = seal(s.db) // see seal.go
		}
		if err != nil {
			err = fmt.Errorf("persist: sweep %s: %v (nothing of this transaction was written; check the disk)", s.opts.Path, err)
			s.log.Error("sweep failed", "err", err)
			c.finishSweep(j, err)
			return
		}
		s.dbEmpty.Store(empty)
		s.setDBNext(next)
		if deleted > 0 {
			s.log.Debug("swept expired records", "deleted", deleted, "done", done)
		}
		if done {
			c.finishSweep(j, nil)
			c.maybeCompact()
			return
		}
		if c.stopping() {
			c.finishSweep(j, s.errClosed)
			return
		}
	}
}

// finishSweep records that pass j deletes nothing any more, then finishes
// its Sweep calls.
func (c *checkpointer) finishSweep(j sweepJob, err error) {
	c.swept.Store(j.id)
	finishAll(j.sweepers, err)
}

func finishAll(cs []*Commit, err error) {
	for _, c := range cs {
		c.finish(err)
	}
}

// sweepBolt walks the expiry index from its start through the entries with
// a deadline <= now, at most budget of them, and deletes each with what it
// finds of its key (done reports that none is left):
//
//   - no record: the entry alone (the record was deleted, or the entry is an
//     older one of a key whose deadline moved earlier);
//   - a record whose deadline is later than now: the entry was a lower bound
//     (a checkpoint that moves a key's deadline later leaves its entry), and
//     goes to the record's deadline;
//   - an expired record, if the overlays hold no newer record of its key
//     (inOverlay): the record too;
//   - an expired record the overlays rewrote: the entry alone; the record
//     is left to the checkpoint that rewrites it, which indexes it again,
//     its old deadline being one a Sweep has passed (bboltWriter.sweptNow).
func sweepBolt(keys, exp *bolt.Bucket, now int64, budget int, inOverlay func(key []byte) bool) (deleted int, done bool, err error) {
	if now <= 0 {
		return 0, true, nil // deadlines are > 0
	}
	var nowKey [8]byte
	binary.BigEndian.PutUint64(nowKey[:], uint64(now))
	var moves [][]byte // entries to insert, later than now
	c := exp.Cursor()
	for {
		// First after each Delete: a bbolt cursor must not step on after
		// deleting under it.
		k, _ := c.First()
		if k == nil || bytes.Compare(k[:min(8, len(k))], nowKey[:]) > 0 {
			done = true
			break
		}
		if deleted >= budget {
			break
		}
		if len(k) > 8 {
			key := k[8:]
			switch v := keys.Get(key); {
			case len(v) < 8:
			case bytes.Compare(v[:8], nowKey[:]) > 0:
				moves = append(moves, append(append(make([]byte, 0, len(k)), v[:8]...), key...))
			case !inOverlay(key):
				if err := keys.Delete(key); err != nil {
					return deleted, false, err
				}
			}
		}
		if err := c.Delete(); err != nil {
			return deleted, false, err
		}
		deleted++
	}
	// In deadline order, after the walk: inserted one by one in random
	// order, each would move the ever longer tail of the node it lands in
	// (bbolt splits nodes only at commit).
	sortIndexKeys(moves)
	for _, m := range moves {
		if err := exp.Put(m, emptyValue); err != nil {
			return deleted, false, err
		}
	}
	return deleted, done, nil
}

// bboltWriter writes overlays into bbolt; it keeps its buffers from one
// transaction to the next.
type bboltWriter struct {
	arena  []byte
	ents   []*entry
	sorted []sortEntry // scratch of sortEntries
	dels   [][]byte    // expiry index entries to delete
	ins    [][]byte    // expiry index entries to insert
	// reindex: every record written gets an index entry (the replay:
	// a Sweep of the last process may have dropped the entry of a record
	// its overlay rewrote).
	reindex bool
	// sweptNow is the latest now of a Sweep pass of this process: a
	// record whose stored deadline is not later may have lost its index
	// entry (see sweepBolt), and a checkpoint indexes it again.
	sweptNow int64
	// cur is a cursor on the keys bucket of the transaction being written,
	// reused from key to key (Bucket.Get allocates one per call).
	cur *bolt.Cursor
}

// maxKeptArena is the largest arena, in bytes, kept for the next checkpoint.
const maxKeptArena = 64 << 20

// maxTxKeys is the most records a checkpoint writes in one bbolt
// transaction. A transaction holds in memory every node it touches and
// every page it dirties until it commits: with keys spread over a large
// file, about 6 KiB per record. Records go in key order, so a checkpoint
// split in transactions rewrites each page about once, as a whole one does.
const maxTxKeys = 4096

// writeOverlay writes every entry of ov, and the WAL position it reaches,
// into bbolt, and returns the earliest deadline in the index after it and
// whether the keys bucket is empty. With whole set, or when ov is not tied
// to a WAL generation, it writes everything in one transaction; else in
// transactions of maxTxKeys records, each recording its progress under
// keyPartial, the last one the WAL position (see keyPartial). The replay
// sets whole: it reads keyPartial, and rewriting it could forget keys an
// earlier, interrupted checkpoint wrote.
//
// Records go in key order, so that each page of the keys bucket is visited
// once. The expiry index changes go after them: deletions first (each in a
// node of page size), then insertions, in deadline order. bbolt splits a
// node only at commit, and new deadlines all land at the ends of the index
// (one end per window): inserted in random order, each would move the ever
// longer tail of one node (quadratic: seconds for 100k records); in order,
// each is appended.
func (w *bboltWriter) writeOverlay(db *bolt.DB, ov *overlay, whole bool, hook func(*bolt.Tx) error) (next int64, empty bool, err error) {
	w.sortEntries(ov)
	w.reindex = whole
	defer func() {
		w.reindex = false
		clear(w.ents)
		w.ents = w.ents[:0]
	}()
	step := maxTxKeys
	if whole || ov.toGen == 0 {
		step = max(len(w.ents), 1)
	}
	for start := 0; ; start += step {
		ents := w.ents[start:min(start+step, len(w.ents))]
		last := start+step >= len(w.ents)
		next, empty, err = w.writeTx(db, ov, ents, last, hook)
		if err == nil && last {
			err = seal(db) // see seal.go
		}
		if err != nil || last {
			return next, empty, err
		}
	}
}

// sortEntry is an overlay entry and 8 bytes of its key, from the first
// byte in which the overlay's keys may differ, as a big-endian number.
type sortEntry struct {
	pre uint64
	e   *entry
}

// sortEntries puts the entries of ov into w.ents in key order. Keys share
// prefixes (a tenant, "bench:"): they are compared first by the 8 bytes
// after the prefix all of them share, held in the array being sorted, and
// only on a tie by the whole key, so that most comparisons read neither the
// entry nor the key's bytes (sorting with strings.Compare on the entries'
// keys took 5% of a node's CPU at a million keys).
func (w *bboltWriter) sortEntries(ov *overlay) {
	w.sorted = w.sorted[:0]
	first, common := "", -1
	ov.m.each(func(e *entry) {
		w.sorted = append(w.sorted, sortEntry{e: e})
		switch {
		case common < 0:
			first, common = e.key, len(e.key)
		case common > 0:
			n := min(common, len(e.key))
			i := 0
			for i < n && first[i] == e.key[i] {
				i++
			}
			common = i
		}
	})
	common = max(common, 0)
	for i := range w.sorted {
		w.sorted[i].pre = keyPrefix(w.sorted[i].e.key, common)
	}
	slices.SortFunc(w.sorted, func(a, b sortEntry) int {
		switch {
		case a.pre < b.pre:
			return -1
		case a.pre > b.pre:
			return 1
		}
		return strings.Compare(a.e.key, b.e.key)
	})
	w.ents = w.ents[:0]
	for i := range w.sorted {
		w.ents = append(w.ents, w.sorted[i].e)
	}
	clear(w.sorted)
	w.sorted = w.sorted[:0]
}

// keyPrefix returns key[from:from+8] as a big-endian number, padded with
// zeros: two keys that share their first from bytes compare as their
// prefixes do, unless the prefixes are equal.
func keyPrefix(key string, from int) uint64 {
	var b [8]byte
	if from < len(key) {
		copy(b[:], key[from:])
	}
	return binary.BigEndian.Uint64(b[:])
}

// writeTx writes ents, part of ov, in one transaction: with the WAL position
// if last, else with the progress marker.
func (w *bboltWriter) writeTx(db *bolt.DB, ov *overlay, ents []*entry, last bool, hook func(*bolt.Tx) error) (next int64, empty bool, err error) {
	need := 16 + 8
	for _, e := range ents {
		need += 3*len(e.key) + 24 + e.size()
	}
	if cap(w.arena) < need {
		w.arena = make([]byte, 0, need+need/4)
	}
	defer func() {
		clear(w.dels)
		clear(w.ins)
		w.dels, w.ins = w.dels[:0], w.ins[:0]
		if cap(w.arena) > maxKeptArena {
			w.arena = nil
		} else {
			w.arena = w.arena[:0]
		}
	}()
	err = db.Update(func(tx *bolt.Tx) error {
		keys, exp, meta := tx.Bucket(bucketKeys), tx.Bucket(bucketExpiry), tx.Bucket(bucketMeta)
		// Deadlines are mostly the time of the write plus a window, so
		// the index grows at its ends: pages that split are left fuller
		// than bbolt's default of half.
		exp.FillPercent = expiryFillPercent
		w.cur = keys.Cursor()
		defer func() { w.cur = nil }()
		// A retry of a failed checkpoint leaves out the keys an earlier
		// try wrote: the data file holds their final values, and a tail
		// written again would be appended twice.
		done := readPartial(meta)
		if w.reindex || done.gen != ov.toGen {
			done = partial{}
		}
		for _, e := range ents {
			if done.gen != 0 && e.key <= done.key {
				continue
			}
			if err := w.put(keys, e); err != nil {
				return err
			}
		}
		// In deadline order too: the old entries of keys in key order
		// are spread over the index, and visited in index order each
		// node is searched once while it is in the cache.
		sortIndexKeys(w.dels)
		for _, k := range w.dels {
			if err := exp.Delete(k); err != nil {
				return err
			}
		}
		sortIndexKeys(w.ins)
		for _, k := range w.ins {
			if err := exp.Put(k, emptyValue); err != nil {
				return err
			}
		}
		switch {
		case last && ov.toGen != 0:
			pos := w.alloc(16)
			binary.BigEndian.PutUint64(pos, ov.toGen)
			binary.BigEndian.PutUint64(pos[8:], ov.lastSeq)
			if err := meta.Put(keyWAL, pos); err != nil {
				return err
			}
			if err := meta.Delete(keyPartial); err != nil {
				return err
			}
		case !last:
			// A retry of a failed checkpoint starts again from its first
			// transaction: the marker keeps the furthest key written.
			key := max(ents[len(ents)-1].key, done.key)
			v := w.alloc(8 + len(key))
			binary.BigEndian.PutUint64(v, ov.toGen)
			copy(v[8:], key)
			if err := meta.Put(keyPartial, v); err != nil {
				return err
			}
		}
		if hook != nil {
			if err := hook(tx); err != nil {
				return err
			}
		}
		next = firstDeadline(exp)
		empty = isEmpty(keys)
		return nil
	})
	return next, empty, err
}

// partial is a checkpoint's progress marker (keyPartial); gen 0 if none.
type partial struct {
	gen uint64
	key string
}

func readPartial(meta *bolt.Bucket) partial {
	v := meta.Get(keyPartial)
	if len(v) < 8 {
		return partial{}
	}
	return partial{binary.BigEndian.Uint64(v), string(v[8:])}
}

// covers reports whether the data file holds the final value, as of WAL
// generation gen, of key: the replay skips such a record.
func (p partial) covers(gen uint64, key []byte) bool {
	return gen <= p.gen && string(key) <= p.key
}

// isEmpty reports whether b holds no key.
func isEmpty(b *bolt.Bucket) bool {
	k, _ := b.Cursor().First()
	return k == nil
}

// sortIndexKeys sorts expiry index keys ([8-byte big-endian deadline][key])
// by deadline, then key: the deadlines compare as integers, and most differ.
func sortIndexKeys(ks [][]byte) {
	slices.SortFunc(ks, func(a, b []byte) int {
		da, db := binary.BigEndian.Uint64(a), binary.BigEndian.Uint64(b)
		switch {
		case da < db:
			return -1
		case da > db:
			return 1
		}
		return bytes.Compare(a[8:], b[8:])
	})
}

// put writes (or deletes) the record of e and notes the changes of the
// expiry index, whose entries are lower bounds of their records' deadlines
// (see doc.go):
//   - a new record gets an entry;
//   - a deadline that moves later keeps the entry the key has: the Sweep
//     that reaches it moves it to the record's deadline;
//   - a deadline that moves earlier, a deletion, and a record whose entry a
//     Sweep may have dropped (its old deadline is one a Sweep of this
//     process has passed, or this is the replay) delete the entry at the
//     old deadline, if it is there, and a record written gets a new one.
//
// So a checkpoint does not search the index for the old entries of the
// keys it rewrites, which are spread over the whole index: what it inserts
// goes near the index's end.
func (w *bboltWriter) put(keys *bolt.Bucket, e *entry) error {
	k := w.alloc(len(e.key))
	copy(k, e.key)
	// keys.Get(k), with the transaction's cursor (the keys bucket holds
	// no nested buckets).
	var old []byte
	if found, v := w.cur.Seek(k); found != nil && bytes.Equal(found, k) {
		old = v
	}
	var oldDL int64
	if len(old) >= 8 {
		oldDL = int64(binary.BigEndian.Uint64(old))
	}
	if e.del {
		if old == nil {
			return nil
		}
		if oldDL != 0 {
			w.dels = append(w.dels, w.expiryKey(old[:8], e.key))
		}
		return keys.Delete(k)
	}
	// A tail goes after the old value, which is the one it was appended
	// to (see entry). Were that value missing, the tail alone is what a
	// replay of its records would store.
	var base []byte
	if e.tail && len(old) > 8 {
		base = old[8:]
	}
	v := w.alloc(8 + len(base) + len(e.value))
	binary.BigEndian.PutUint64(v, uint64(e.deadline))
	copy(v[8+copy(v[8:], base):], e.value)
	switch {
	case oldDL == 0:
		w.ins = append(w.ins, w.expiryKey(v[:8], e.key))
	case e.deadline < oldDL || oldDL <= w.sweptNow || w.reindex:
		w.dels = append(w.dels, w.expiryKey(old[:8], e.key))
		w.ins = append(w.ins, w.expiryKey(v[:8], e.key))
	}
	return keys.Put(k, v)
}

// alloc returns n bytes of the arena. The arena is sized for the whole
// transaction before it starts and never reallocated during it, because
// bbolt keeps the key and value slices it is given until commit.
func (w *bboltWriter) alloc(n int) []byte {
	l := len(w.arena)
	if l+n > cap(w.arena) {
		return make([]byte, n) // unreachable when need was computed right
	}
	w.arena = w.arena[:l+n]
	return w.arena[l : l+n : l+n]
}

// expiryKey returns the index key [deadline][key].
func (w *bboltWriter) expiryKey(deadline []byte, key string) []byte {
	b := w.alloc(8 + len(key))
	copy(b, deadline)
	copy(b[8:], key)
	return b
}
