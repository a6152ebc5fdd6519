package persist

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// defaultSweepBudget is how many index entries one transaction of a Sweep
// pass deletes at most.
const defaultSweepBudget = 10000

// expiryFillPercent is how full bbolt leaves the pages of the expiry index
// it splits (its default, for random inserts, is 0.5).
const expiryFillPercent = 0.9

// maxKeptArena is the largest arena, in bytes, kept for the next transaction.
const maxKeptArena = 16 << 20

// emptyValue is the value of every expiry index entry.
var emptyValue = []byte{}

// writer is the state of the writer goroutine; nothing else touches it
// while the goroutine runs (Close reads unreported after it ended).
type writer struct {
	s           *Store
	maxRecs     int
	sweepBudget int

	// beforeCommit, if set (by tests), runs at the end of every write
	// transaction; an error fails it.
	beforeCommit func(*bolt.Tx) error

	batch  []*Commit // batches and flushes of the transaction, in queue order
	nrecs  int       // records in batch
	closed bool      // the queue is closed and drained

	sweeping bool      // a Sweep pass is under way
	sweepNew bool      // a Sweep joined it since its last transaction
	sweepNow int64     // its time: delete deadlines <= sweepNow
	sweepers []*Commit // the Sweep calls it answers

	// unreported is the first transaction error that no Flush has returned.
	unreported error

	arena []byte // keys and values of the transaction, see alloc
}

func (w *writer) init(s *Store) {
	w.s = s
	w.maxRecs = s.opts.MaxTxRecords
	w.sweepBudget = defaultSweepBudget
}

// run is the writer goroutine: collect what is queued, write it in one
// transaction, acknowledge, repeat; sleep on the queue when there is nothing
// to do.
func (w *writer) run() {
	defer close(w.s.writerDone)
	for {
		w.collect()
		// Once the queue is closed, a pass under way stops, but a Sweep
		// that was queued gets its transaction, as a batch would.
		if w.closed && len(w.batch) == 0 && !w.sweepNew {
			if w.sweeping {
				w.finishSweep(w.s.errClosed)
			}
			return
		}
		w.commit()
	}
}

// collect fills batch: it blocks for the first item unless a Sweep pass has
// more to do, then takes what else is queued without blocking, until
// maxRecs records.
func (w *writer) collect() {
	w.batch = w.batch[:0]
	w.nrecs = 0
	if w.closed {
		return
	}
	if !w.sweeping {
		c, ok := <-w.s.queue
		if !ok {
			w.closed = true
			return
		}
		w.add(c)
	}
	for w.nrecs < w.maxRecs {
		select {
		case c, ok := <-w.s.queue:
			if !ok {
				w.closed = true
				return
			}
			w.add(c)
		default:
			return
		}
	}
}

func (w *writer) add(c *Commit) {
	if c.kind == kindSweep {
		if !w.sweeping || c.now > w.sweepNow {
			w.sweepNow = c.now
		}
		w.sweeping = true
		w.sweepNew = true
		w.sweepers = append(w.sweepers, c)
		return
	}
	w.batch = append(w.batch, c)
	w.nrecs += len(c.recs)
}

// commit writes batch and a step of the Sweep pass in one transaction and
// acknowledges them.
func (w *writer) commit() {
	s := w.s
	if w.nrecs == 0 && !w.sweeping {
		// Only flushes and empty batches: everything before them is
		// committed (and synced in ModeFsync) already.
		w.finishBatch(nil)
		return
	}

	start := time.Now()
	var (
		next      int64
		deleted   int
		sweepDone bool
	)
	err := s.db.Update(func(tx *bolt.Tx) error {
		keys, exp := tx.Bucket(bucketKeys), tx.Bucket(bucketExpiry)
		// Deadlines are mostly the time of the write plus a window, so
		// the index grows at its end (one end per window): pages that split
		// are left fuller than bbolt's default of half.
		exp.FillPercent = expiryFillPercent
		if err := w.apply(keys, exp); err != nil {
			return err
		}
		if w.sweeping {
			w.sweepNew = false
			var err error
			if deleted, sweepDone, err = w.sweep(keys, exp); err != nil {
				return err
			}
		}
		if w.beforeCommit != nil {
			if err := w.beforeCommit(tx); err != nil {
				return err
			}
		}
		next = firstDeadline(exp)
		return nil
	})
	d := time.Since(start)
	w.resetArena()
	if s.opts.OnCommit != nil {
		s.opts.OnCommit(w.nrecs, d)
	}

	if err != nil {
		err = fmt.Errorf("persist: commit to %s: %v (nothing of this transaction was written; check the disk)", s.opts.Path, err)
		s.log.Error("transaction failed", "records", w.nrecs, "sweep", w.sweeping, "err", err)
	} else {
		if deleted > 0 {
			s.log.Debug("swept expired records", "deleted", deleted, "done", sweepDone)
		}
		old := s.next.Swap(next)
		if next != 0 && (old == 0 || next < old) {
			select {
			case s.changed <- struct{}{}:
			default:
			}
		}
	}
	w.finishBatch(err)
	if w.sweeping && (err != nil || sweepDone) {
		w.finishSweep(err)
	}
}

// finishBatch acknowledges batch in queue order. A flush gets the first
// error of a batch before it that no earlier flush reported.
func (w *writer) finishBatch(err error) {
	pending := w.unreported
	for i, c := range w.batch {
		w.batch[i] = nil
		if c.kind == kindFlush {
			c.finish(pending)
			pending = nil
			continue
		}
		if err != nil && pending == nil {
			pending = err
		}
		c.finish(err)
	}
	w.unreported = pending
}

func (w *writer) finishSweep(err error) {
	for i, c := range w.sweepers {
		w.sweepers[i] = nil
		c.finish(err)
	}
	w.sweepers = w.sweepers[:0]
	w.sweeping = false
	w.sweepNow = 0
}

// apply writes the records of batch in submission order, so that the last
// record of a key wins. (Sorting them by key first was measured: it made
// transactions slower, not faster; bbolt keeps the nodes it touched in memory
// until commit whatever the order.)
func (w *writer) apply(keys, exp *bolt.Bucket) error {
	need := 0
	for _, c := range w.batch {
		for i := range c.recs {
			r := &c.recs[i]
			need += 3*len(r.Key) + 24 + len(r.Value)
		}
	}
	if cap(w.arena) < need {
		w.arena = make([]byte, 0, need+need/4)
	}
	for _, c := range w.batch {
		for i := range c.recs {
			if err := w.put(keys, exp, &c.recs[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// put writes (or deletes) one record and keeps the expiry index in step:
// the old entry, found from the stored deadline, goes; the new one comes.
func (w *writer) put(keys, exp *bolt.Bucket, r *Record) error {
	k := w.alloc(len(r.Key))
	copy(k, r.Key)
	old := keys.Get(k)
	var oldDL []byte
	if len(old) >= 8 {
		oldDL = old[:8]
	}
	if r.Value == nil {
		if old == nil {
			return nil
		}
		if oldDL != nil {
			if err := exp.Delete(w.expiryKey(oldDL, r.Key)); err != nil {
				return err
			}
		}
		return keys.Delete(k)
	}
	v := w.alloc(8 + len(r.Value))
	binary.BigEndian.PutUint64(v, uint64(r.Deadline))
	copy(v[8:], r.Value)
	if oldDL == nil || !bytes.Equal(oldDL, v[:8]) {
		if oldDL != nil {
			if err := exp.Delete(w.expiryKey(oldDL, r.Key)); err != nil {
				return err
			}
		}
		if err := exp.Put(w.expiryKey(v[:8], r.Key), emptyValue); err != nil {
			return err
		}
	}
	return keys.Put(k, v)
}

// sweep deletes, from the start of the expiry index, the entries with a
// deadline <= sweepNow and their records, at most sweepBudget of them. done
// reports that none is left.
func (w *writer) sweep(keys, exp *bolt.Bucket) (deleted int, done bool, err error) {
	if w.sweepNow <= 0 {
		return 0, true, nil // deadlines are > 0
	}
	var now [8]byte
	binary.BigEndian.PutUint64(now[:], uint64(w.sweepNow))
	c := exp.Cursor()
	for {
		// First after each Delete: a bbolt cursor must not step on after
		// deleting under it.
		k, _ := c.First()
		if k == nil || bytes.Compare(k[:min(8, len(k))], now[:]) > 0 {
			return deleted, true, nil
		}
		if deleted >= w.sweepBudget {
			return deleted, false, nil
		}
		if len(k) > 8 {
			key := k[8:]
			if v := keys.Get(key); len(v) >= 8 && bytes.Equal(v[:8], k[:8]) {
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
}

// alloc returns n bytes of the arena. The arena is sized for the whole
// transaction before it starts and never reallocated during it, because
// bbolt keeps the key and value slices it is given until commit.
func (w *writer) alloc(n int) []byte {
	l := len(w.arena)
	if l+n > cap(w.arena) {
		return make([]byte, n) // unreachable when need was computed right
	}
	w.arena = w.arena[:l+n]
	return w.arena[l : l+n : l+n]
}

// expiryKey returns the index key [deadline][key].
func (w *writer) expiryKey(deadline []byte, key string) []byte {
	b := w.alloc(8 + len(key))
	copy(b, deadline)
	copy(b[8:], key)
	return b
}

func (w *writer) resetArena() {
	if cap(w.arena) > maxKeptArena {
		w.arena = nil
		return
	}
	w.arena = w.arena[:0]
}
