package persist

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"time"

	bolt "go.etcd.io/bbolt"
)

// defaultSweepBudget is how many records one step of a Sweep pass deletes
// at most: tombstones in one WAL frame, or deletions in one bbolt
// transaction.
const defaultSweepBudget = 10000

// maxKeptFrame is the largest frame buffer, in bytes, kept for the next
// commit.
const maxKeptFrame = 16 << 20

// writer is the state of the writer goroutine; nothing else touches it
// while the goroutine runs (Close reads closeErr after it ended).
type writer struct {
	s           *Store
	maxRecs     int
	sweepBudget int

	// beforeWrite is Options.WriteFault (tests): if set, it runs before
	// every WAL write, and an error fails the write.
	beforeWrite func() error

	// failures are the commits that failed since the last one logged, and
	// the time of that line: a full disk fails every commit, and one line
	// a second says as much as thousands.
	failures      int
	failuresTotal int
	failLogged    time.Time

	batch    []*Commit // batches and flushes of the commit, in queue order
	nrecs    int       // records in batch
	nappends int       // appends among them
	nconds   int       // conditional appends among them
	nskipped int       // conditional appends left out (see resolveConds)
	closed   bool      // the queue is closed and drained

	// The values that the appends of the commit add to, looked up in the
	// data file for keys that neither overlay holds (see readBases).
	bases    map[string]baseRef
	baseKeys []string
	keyBuf   []byte
	// The keys of the commit's conditional appends, and the deadline each
	// holds as far as resolveConds went (0: none).
	conds map[string]condBase

	maxValue   int    // the longest value an append may make: MaxValueLen (tests lower it)
	longWarned bool   // a too long append was logged
	longKey    string // the key of one in the commit being applied, if any

	// Sweep passes handed to the checkpointer: the id of the last one, and
	// the latest time of those that may not be finished (0 once all are).
	sweepID     uint64
	sweepMaxNow int64

	sweeping bool      // the overlay part of a Sweep pass is under way
	sweepNew bool      // a Sweep joined it since its last step
	sweepNow int64     // its time: delete deadlines <= sweepNow
	sweepers []*Commit // the Sweep calls it answers

	// The step of the commit under way: tombstones to write, and the heap
	// entries popped to find them (pushed back if the write fails).
	tombs       []string
	swept       []heapItem
	sweptFrozen []heapItem

	// unreported is the first commit or checkpoint error that no Flush
	// has returned.
	unreported error

	wal     *os.File
	walSize int64  // bytes of wal written so far
	gen     uint64 // wal's generation
	seq     uint64 // the sequence number of the next frame
	broken  error  // set when the WAL cannot be written any more
	enc     frameEncoder

	ckRunning bool      // the checkpointer is writing s.frozen
	ckRetryAt int64     // after a failed checkpoint: cur.bytes at which to try again
	ckWaiters []*Commit // checkpoint requests (Scan), each waiting for its gen
	doneGen   uint64    // every WAL generation <= doneGen is in bbolt
	spare     *overlay  // the last checkpointed overlay, emptied for reuse

	closeErr error // the outcome of the final checkpoint, for Close

	sink int64 // keeps the loads of table.warm
}

func (w *writer) init(s *Store, wal *os.File, gen, seq uint64) {
	w.s = s
	w.maxRecs = s.opts.MaxTxRecords
	w.sweepBudget = defaultSweepBudget
	w.maxValue = MaxValueLen
	w.beforeWrite = s.opts.WriteFault
	w.wal, w.walSize, w.gen, w.seq = wal, walHeaderLen, gen, seq
	w.doneGen = gen - 1
}

// run is the writer goroutine: collect what is queued, append it to the WAL
// in one frame, apply it to the overlay, acknowledge, repeat; sleep on the
// queue when there is nothing to do.
func (w *writer) run() {
	defer close(w.s.writerDone)
	for {
		w.collect()
		// Once the queue is closed, a pass under way stops, but a Sweep
		// that was queued gets its step, as a batch would.
		if w.closed && len(w.batch) == 0 && !w.sweepNew {
			if w.sweeping {
				w.finishSweep(w.s.errClosed)
			}
			w.closeErr = w.shutdown()
			return
		}
		w.commit()
	}
}

// collect fills batch: it blocks for the first item unless a Sweep pass has
// more to do, then takes what else is queued without blocking, until
// maxRecs records. While it waits, it takes the results of checkpoints.
func (w *writer) collect() {
	w.batch = w.batch[:0]
	w.nrecs, w.nappends, w.nconds, w.nskipped = 0, 0, 0, 0
	if w.closed {
		return
	}
	if !w.sweeping {
		for {
			select {
			case res := <-w.s.ckDone:
				w.checkpointed(res)
				w.serveWaiters()
				continue
			case c, ok := <-w.s.queue:
				if !ok {
					w.closed = true
					return
				}
				w.add(c)
			}
			break
		}
	}
	yielded := false
	for w.nrecs < w.maxRecs {
		select {
		case c, ok := <-w.s.queue:
			if !ok {
				w.closed = true
				return
			}
			w.add(c)
		default:
			if yielded {
				return
			}
			// Let the goroutines that are ready run first: on a busy
			// node they are deciding, and their records join this
			// write instead of each taking one of its own. On an idle
			// node nothing else is ready and this returns at once.
			yielded = true
			runtime.Gosched()
		}
	}
}

func (w *writer) add(c *Commit) {
	switch c.kind {
	case kindSweep:
		if !w.sweeping || c.now > w.sweepNow {
			w.sweepNow = c.now
		}
		w.sweeping = true
		w.sweepNew = true
		w.sweepers = append(w.sweepers, c)
		return
	case kindCheckpoint:
		w.requestCheckpoint(c)
		return
	}
	if c.after != nil {
		if err := c.after.failure(); err != nil {
			// It builds on a batch that failed: it keeps its place in the
			// queue, so that its done callback runs in order, but nothing
			// of it is written (finishBatch fails it with err).
			c.skip = err
			c.recs, c.appends, c.conds = nil, 0, 0
		}
	}
	w.batch = append(w.batch, c)
	w.nrecs += len(c.recs)
	w.nappends += c.appends
	w.nconds += c.conds
}

// commit writes batch and a step of the Sweep pass as one WAL frame, applies
// them to the overlay, and acknowledges them.
func (w *writer) commit() {
	s := w.s
	if w.nrecs == 0 && !w.sweeping {
		// Only flushes and empty batches: everything before them is
		// committed (and synced in ModeFsync) already.
		w.finishBatch(nil)
		w.serveWaiters()
		return
	}

	start := time.Now()
	sweepDone := false
	if w.sweeping {
		w.sweepNew = false
		sweepDone = w.pickExpired()
	}
	var err error
	if w.nappends > 0 {
		if err = w.readBases(); err != nil {
			err = fmt.Errorf("read the values to append to: %v", err)
		} else if w.nconds > 0 {
			w.resolveConds()
		}
	}
	n := len(w.tombs) + w.nrecs - w.nskipped
	if n > 0 {
		if err == nil {
			err = w.write()
		}
		d := time.Since(start)
		if err == nil {
			w.apply()
			w.recovered()
		} else {
			w.unpick()
			err = fmt.Errorf("persist: commit to %s: %v (nothing of this commit was written; check the disk)", s.opts.Path, err)
			w.failed(n, err)
		}
		if s.opts.OnCommit != nil {
			s.opts.OnCommit(n, d)
		}
	}
	w.tombs = w.tombs[:0]
	clear(w.swept)
	clear(w.sweptFrozen)
	w.swept, w.sweptFrozen = w.swept[:0], w.sweptFrozen[:0]

	w.finishBatch(err)
	if w.sweeping {
		switch {
		case err != nil:
			w.finishSweep(err)
		case sweepDone:
			// The overlay holds nothing expired as of sweepNow: bbolt's
			// turn, on the checkpointer, which finishes the Sweep calls.
			w.sweepID++
			w.sweepMaxNow = max(w.sweepMaxNow, w.sweepNow)
			s.ck.sweep(sweepJob{id: w.sweepID, now: w.sweepNow, budget: w.sweepBudget, sweepers: w.sweepers})
			w.sweepers = nil
			w.sweeping = false
			w.sweepNow = 0
		}
	}
	if err == nil {
		w.maybeCheckpoint()
	}
	w.serveWaiters()
}

// write encodes the tombstones and batch as one frame and appends it to
// the WAL (fdatasync'ed in ModeFsync).
func (w *writer) write() error {
	if w.broken != nil {
		return w.broken
	}
	e := &w.enc
	e.begin(w.seq)
	for _, k := range w.tombs {
		e.del(k)
	}
	for _, c := range w.batch {
		left := c.skipped
		for i := range c.recs {
			if len(left) > 0 && left[0] == i {
				left = left[1:]
				continue
			}
			e.record(&c.recs[i])
		}
	}
	frame, err := e.end()
	defer e.reset(maxKeptFrame)
	if err != nil {
		return err
	}
	if w.beforeWrite != nil {
		if err := w.beforeWrite(); err != nil {
			return err
		}
	}
	_, err = w.wal.WriteAt(frame, w.walSize)
	if err == nil && w.s.opts.Mode == ModeFsync {
		if err = fdatasync(w.wal); err != nil {
			// After a failed fsync, what reached the disk is unknown:
			// stop writing rather than acknowledge on top of it.
			w.broken = fmt.Errorf("WAL %s: fdatasync failed earlier: %v (restart sluice)", w.wal.Name(), err)
		}
	}
	if err != nil {
		if terr := w.wal.Truncate(w.walSize); terr != nil && w.broken == nil {
			w.broken = fmt.Errorf("WAL %s: cannot truncate a failed write: %v (restart sluice)", w.wal.Name(), terr)
		}
		return err
	}
	w.walSize += int64(len(frame))
	w.s.cur.bytes += int64(len(frame))
	w.s.cur.lastSeq = w.seq
	w.seq++
	return nil
}

// apply records the frame just written in the current overlay, which makes
// it visible to Get, and updates NextDeadline.
func (w *writer) apply() {
	s := w.s
	cur := s.cur
	if w.nappends == 0 {
		w.warm() // readBases did, for a commit with appends
	}
	s.ovMu.Lock()
	for _, k := range w.tombs {
		cur.del(k)
	}
	for _, c := range w.batch {
		left := c.skipped
		for i := range c.recs {
			if len(left) > 0 && left[0] == i {
				left = left[1:]
				continue
			}
			r := &c.recs[i]
			switch {
			case r.Value == nil:
				cur.del(r.Key)
			case r.Append:
				w.applyAppend(r)
			default:
				cur.put(r.Key, r.Deadline, r.Value)
			}
		}
	}
	s.ovMu.Unlock()
	if w.longKey != "" {
		if !w.longWarned {
			w.longWarned = true
			s.log.Warn("an append would make a value longer than the longest the data file stores: stored the appended bytes alone, dropping the value they were appended to (the caller must bound how long its values grow); later cases are not logged", "key", w.longKey, "max_bytes", w.maxValue)
		}
		w.longKey = ""
	}
	w.updateNext()
}

// applyAppend applies an append to the current overlay, holding ovMu: the
// bytes go at the end of the key's entry if it has one (a put or a tail;
// after a deletion they are the value alone), else into a tail over the
// key's latest value, the frozen overlay's or else the data file's (found
// by readBases), else alone.
func (w *writer) applyAppend(r *Record) {
	cur := w.s.cur
	var ok bool
	if e := cur.m.get(r.Key); e != nil {
		ok = cur.appendTo(e, r.Key, r.Deadline, r.Value, nil, w.maxValue)
	} else if n, found := w.baseLen(r.Key); found {
		ok = cur.appendTail(r.Key, r.Deadline, r.Value, n, w.maxValue)
	} else {
		ok = cur.appendTo(nil, r.Key, r.Deadline, r.Value, nil, w.maxValue)
	}
	if !ok {
		w.longKey = r.Key
	}
}

// baseLen returns the length of the latest value of key when the current
// overlay holds no entry of it, and whether there is one: the frozen
// overlay's (none for a deletion), else the data file's as readBases found
// it.
//
// The frozen overlay is read-only while the checkpointer writes it, so this
// goroutine reads it without ovMu. Only this goroutine drops it (s.frozen set
// to nil in checkpointed, once its checkpoint is committed in the data file)
// or freezes another, and never between readBases and the apply of the same
// commit: a key that readBases did not find in the frozen overlay is not in
// it here, and its latest value is the one readBases found in the data
// file; a key found there is still there.
func (w *writer) baseLen(key string) (int, bool) {
	if f := w.s.frozen; f != nil {
		if e := f.m.get(key); e != nil {
			return e.size(), !e.del
		}
	}
	b, ok := w.bases[key]
	return b.len, ok && b.found
}

// baseRef is what readBases found in the data file for a key appended to:
// found is false if it holds no value.
type baseRef struct {
	len      int
	deadline int64
	found    bool
}

// readBases runs before a commit with appends is written: it finds the
// appends whose key neither overlay holds, and looks those keys up in the
// data file, all in one read transaction (the writer is the commit path: one
// transaction per frame, not per key), noting the length and deadline of
// their values. An append whose key an earlier record of the same frame
// writes does not need its value, which is looked up all the same: the frame
// is applied in order, after.
//
// A value read there that has expired may belong to a Sweep pass handed to
// the checkpointer and not finished: the pass may delete it at any moment
// (the overlay does not hold its key yet, so the pass does not skip it), and
// appending to a value that a replay after a crash finds deleted would make
// the overlay disagree with the replay. Such a key, whose deadline is not
// after the time of a pass that may not be finished, gets a tombstone at the
// start of this frame instead, applied before the append, which then stores
// its bytes alone: the pass was queued first, and deletes every record whose
// deadline is not after its time.
func (w *writer) readBases() error {
	s := w.s
	clear(w.bases)
	w.baseKeys = w.baseKeys[:0]
	cur, frozen := s.cur, s.frozen
	w.warm() // the lookups below, one after the other, then hit the cache
	for _, c := range w.batch {
		if c.appends == 0 {
			continue
		}
		for i := range c.recs {
			r := &c.recs[i]
			if !r.Append || cur.m.get(r.Key) != nil || frozen != nil && frozen.m.get(r.Key) != nil {
				continue
			}
			if _, ok := w.bases[r.Key]; ok {
				continue
			}
			if w.bases == nil {
				w.bases = make(map[string]baseRef)
			}
			w.bases[r.Key] = baseRef{}
			w.baseKeys = append(w.baseKeys, r.Key)
		}
	}
	// The checkpointer clears dbEmpty before it sends the result of the
	// checkpoint that wrote a key; a key written by one is in the frozen
	// overlay until this goroutine takes that result.
	if len(w.baseKeys) == 0 || s.dbEmpty.Load() {
		return nil
	}
	if s.ck.swept.Load() >= w.sweepID {
		w.sweepMaxNow = 0 // every pass handed over is finished
	}
	return s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		for _, k := range w.baseKeys {
			w.keyBuf = append(w.keyBuf[:0], k...)
			v := b.Get(w.keyBuf)
			switch {
			case v == nil:
				continue
			case len(v) < 8:
				return fmt.Errorf("record %q is %d bytes, shorter than its deadline (the data file is corrupt)", k, len(v))
			case int64(binary.BigEndian.Uint64(v)) <= w.sweepMaxNow:
				w.tombs = append(w.tombs, k)
				continue
			}
			w.bases[k] = baseRef{len(v) - 8, int64(binary.BigEndian.Uint64(v)), true}
		}
		return nil
	})
}

// condBase is what resolveConds knows of a key: whether it looked it up,
// and the deadline of the value it then holds (0: none).
type condBase struct {
	known    bool
	deadline int64
}

// resolveConds decides which conditional appends of the commit are
// written (Record.IfLive), and sets their commits' skipped to the others.
// It runs after readBases and pickExpired, before the frame is written,
// and follows the commit's records in the order they are applied: a key's
// value is what the records before it in the frame leave, else what the
// overlays hold, else what readBases read from the data file. A value this
// frame's tombstones delete (a Sweep's step) counts as none: so does one
// whose deadline is not after the Sweep's time, tombstoned or not, which
// at worst leaves out an append that had a value to go to (its caller then
// writes the whole value), never the reverse.
func (w *writer) resolveConds() {
	if w.conds == nil {
		w.conds = make(map[string]condBase)
	}
	clear(w.conds)
	for _, c := range w.batch {
		if c.conds == 0 {
			continue
		}
		for i := range c.recs {
			if r := &c.recs[i]; r.IfLive != 0 {
				w.conds[r.Key] = condBase{}
			}
		}
	}
	for _, c := range w.batch {
		for i := range c.recs {
			r := &c.recs[i]
			b, ok := w.conds[r.Key]
			if !ok {
				continue
			}
			if !b.known {
				b = condBase{known: true, deadline: w.deadlineOf(r.Key)}
			}
			switch {
			case r.Value == nil:
				b.deadline = 0
			case r.IfLive != 0 && b.deadline <= r.IfLive:
				c.skipped = append(c.skipped, i)
				w.nskipped++
			default: // a put, or an append, sets the key's deadline
				b.deadline = r.Deadline
			}
			w.conds[r.Key] = b
		}
	}
}

// deadlineOf returns the deadline of the value key holds before the
// commit's records (0: none), for resolveConds: the current overlay's,
// the frozen one's, or the data file's as readBases read it.
func (w *writer) deadlineOf(key string) int64 {
	s := w.s
	live := func(e *entry) int64 {
		if e.del || w.sweeping && e.deadline <= w.sweepNow {
			return 0
		}
		return e.deadline
	}
	if e := s.cur.m.get(key); e != nil {
		return live(e)
	}
	if f := s.frozen; f != nil {
		if e := f.m.get(key); e != nil {
			return live(e)
		}
	}
	if b := w.bases[key]; b.found && !(w.sweeping && b.deadline <= w.sweepNow) {
		return b.deadline
	}
	return 0
}

// warm loads the current overlay's slot and entry of each record of the
// commit: these loads do not depend on each other, so the processor
// overlaps their cache misses, which lookups one after the other would each
// wait for.
func (w *writer) warm() {
	cur := w.s.cur
	var sink int64
	for _, c := range w.batch {
		for i := range c.recs {
			sink += cur.m.warm(c.recs[i].Key)
		}
	}
	w.sink = sink
}

// updateNext publishes the earliest deadline of the overlays, after
// settling the tops of their heaps.
func (w *writer) updateNext() {
	s := w.s
	var next int64
	if it, ok := s.cur.settle(nil); ok {
		next = it.deadline
	}
	if s.frozen != nil {
		if it, ok := s.frozen.settle(w.shadowed); ok && (next == 0 || it.deadline < next) {
			next = it.deadline
		}
	}
	s.setOverlayNext(next)
}

// shadowed reports whether the current overlay holds key: the frozen
// overlay's record of it is not the latest.
func (w *writer) shadowed(key string) bool { return w.s.cur.m.get(key) != nil }

// pickExpired pops, from the overlays' heaps, the records whose deadline
// is <= sweepNow, at most sweepBudget of them, into tombs. done reports
// that none is left.
func (w *writer) pickExpired() (done bool) {
	if w.sweepNow <= 0 {
		return true // deadlines are > 0
	}
	cur, frozen := w.s.cur, w.s.frozen
	for len(w.tombs) < w.sweepBudget {
		// A settled top is a put whose deadline is the item's.
		if it, ok := cur.settle(nil); ok && it.deadline <= w.sweepNow {
			w.swept = append(w.swept, cur.pop())
			it.e.heaped = false
			w.tombs = append(w.tombs, it.e.key)
			continue
		}
		if frozen != nil {
			if it, ok := frozen.settle(w.shadowed); ok && it.deadline <= w.sweepNow {
				w.sweptFrozen = append(w.sweptFrozen, frozen.pop())
				it.e.heaped = false
				w.tombs = append(w.tombs, it.e.key)
				continue
			}
		}
		return true
	}
	return false
}

// unpick puts back what pickExpired popped, after a failed write.
func (w *writer) unpick() {
	for _, it := range w.swept {
		it.e.heaped = true
		w.s.cur.push(it)
	}
	for _, it := range w.sweptFrozen {
		it.e.heaped = true
		w.s.frozen.push(it)
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
		cerr := err
		if c.skip != nil {
			cerr = c.skip
		}
		if cerr != nil && pending == nil {
			pending = cerr
		}
		c.finish(cerr)
	}
	w.unreported = pending
}

// failure is, on the writer goroutine, the error of c, a batch the writer
// took from the queue before the one that builds on it: nil if it
// succeeded or is in the commit being collected, which the one that
// builds on it joins.
func (c *Commit) failure() error {
	if c.skip != nil {
		return c.skip // not written; it may not be done yet (same commit)
	}
	_, err := c.Status()
	return err
}

func (w *writer) finishSweep(err error) {
	finishAll(w.sweepers, err)
	clear(w.sweepers)
	w.sweepers = w.sweepers[:0]
	w.sweeping = false
	w.sweepNow = 0
}

func (w *writer) report(err error) {
	if w.unreported == nil {
		w.unreported = err
	}
}

// maybeCheckpoint freezes the current overlay once it holds
// CheckpointKeys keys or CheckpointMemory bytes of entries, or
// CheckpointBytes of WAL. If the previous checkpoint
// still runs, it waits for it first: that bounds the memory of the
// overlays to two of them.
func (w *writer) maybeCheckpoint() {
	s := w.s
	cur := s.cur
	if cur.m.len() < s.opts.CheckpointKeys && cur.mem < s.opts.CheckpointMemory && cur.bytes < s.opts.CheckpointBytes {
		return
	}
	if cur.bytes < w.ckRetryAt {
		return // a checkpoint failed: retry when the WAL has grown again
	}
	if w.ckRunning {
		w.checkpointed(<-s.ckDone)
	}
	if s.frozen != nil {
		// The last checkpoint failed: the frozen overlay goes first.
		w.ckRunning = true
		s.ck.checkpoint(s.frozen)
		w.checkpointed(<-s.ckDone)
		if s.frozen != nil {
			return
		}
	}
	if err := w.freeze(); err != nil {
		w.ckRetryAt = cur.bytes + s.opts.CheckpointBytes
		w.report(err)
		s.log.Error("cannot start a checkpoint", "err", err)
	}
}

// freeze starts a new WAL generation and hands the current overlay to the
// checkpointer. No checkpoint may be under way or failed.
func (w *writer) freeze() error {
	s := w.s
	f, err := createWAL(s.opts.Path, w.gen+1, s.opts.Mode == ModeFsync)
	if err != nil {
		return fmt.Errorf("persist: checkpoint to %s: start a new WAL file: %v", s.opts.Path, err)
	}
	if err := w.wal.Close(); err != nil {
		s.log.Warn("closing a WAL file", "err", err)
	}
	cur := s.cur
	cur.toGen = w.gen
	w.wal, w.walSize, w.gen = f, walHeaderLen, w.gen+1
	next := w.spare
	if next == nil {
		next = newOverlay()
	}
	w.spare = nil
	next.lastSeq, next.gen = cur.lastSeq, w.gen
	s.ovMu.Lock()
	s.frozen, s.cur = cur, next
	s.ovMu.Unlock()
	w.ckRetryAt = 0
	w.ckRunning = true
	s.ck.checkpoint(cur)
	return nil
}

// checkpointed takes the result of a checkpoint: on success the frozen
// overlay is dropped (bbolt has it all), on failure it stays, still read by
// Get, and is written again by the next checkpoint.
func (w *writer) checkpointed(res ckResult) {
	s := w.s
	w.ckRunning = false
	if res.err != nil {
		// Every request waits for this overlay first: they all fail.
		w.report(res.err)
		w.ckRetryAt = s.cur.bytes + s.opts.CheckpointBytes
		w.failWaiters(w.gen, res.err)
		return
	}
	s.ovMu.Lock()
	s.frozen = nil
	s.ovMu.Unlock()
	// No Get can reach it now: its map, heap and entries serve again.
	res.ov.recycle()
	w.spare = res.ov
	w.doneGen = res.ov.toGen
	w.updateNext()
	kept := w.ckWaiters[:0]
	for _, c := range w.ckWaiters {
		if c.gen <= w.doneGen {
			c.finish(nil)
		} else {
			kept = append(kept, c)
		}
	}
	clear(w.ckWaiters[len(kept):])
	w.ckWaiters = kept
}

func (w *writer) failWaiters(gen uint64, err error) {
	kept := w.ckWaiters[:0]
	for _, c := range w.ckWaiters {
		if c.gen <= gen {
			c.finish(err)
		} else {
			kept = append(kept, c)
		}
	}
	clear(w.ckWaiters[len(kept):])
	w.ckWaiters = kept
}

// requestCheckpoint registers c, a request that everything committed so far
// reach bbolt.
func (w *writer) requestCheckpoint(c *Commit) {
	s := w.s
	switch {
	case s.cur.m.len() > 0:
		c.gen = w.gen
	case s.frozen != nil:
		c.gen = s.frozen.toGen
	default:
		c.finish(nil)
		return
	}
	w.ckWaiters = append(w.ckWaiters, c)
}

// serveWaiters starts the checkpoint the waiting requests need, unless one
// runs.
func (w *writer) serveWaiters() {
	s := w.s
	if len(w.ckWaiters) == 0 || w.ckRunning {
		return
	}
	if s.frozen != nil {
		w.ckRunning = true // retry the failed one
		s.ck.checkpoint(s.frozen)
		return
	}
	if s.cur.m.len() == 0 {
		for _, c := range w.ckWaiters {
			c.finish(nil)
		}
		clear(w.ckWaiters)
		w.ckWaiters = w.ckWaiters[:0]
		return
	}
	if err := w.freeze(); err != nil {
		w.report(err)
		w.failWaiters(w.gen, err)
	}
}

// shutdown runs once the queue is closed and drained: it waits for the
// checkpoint under way, stops the checkpointer, writes the overlays into
// bbolt, syncs it, removes the WAL files and, if nothing failed, records
// the run as closed cleanly. If a checkpoint fails, the WAL files stay, and
// the next Open replays them.
func (w *writer) shutdown() error {
	s := w.s
	if w.ckRunning {
		w.checkpointed(<-s.ckDone)
	}
	s.ck.shutdown()
	werr := w.wal.Close()
	if s.crashOnClose {
		return nil
	}
	err := w.unreported
	ckerr := w.finalCheckpoint()
	if ckerr == nil && werr != nil {
		ckerr = fmt.Errorf("persist: close %s: close WAL file: %v", s.opts.Path, werr)
	}
	w.failWaiters(w.gen, s.errClosed)
	if ckerr != nil {
		s.log.Error("final checkpoint failed; the WAL will be replayed at the next open", "err", ckerr)
		if err == nil {
			err = ckerr
		}
		return err
	}
	if serr := s.db.Sync(); serr != nil {
		if err == nil {
			err = fmt.Errorf("persist: close %s: sync: %v (the WAL is kept and will be replayed at the next open)", s.opts.Path, serr)
		}
		return err
	}
	s.ck.removeWALs(w.gen)
	if err != nil {
		return err // a commit failed: not a clean close
	}
	run := s.run
	run.clean = true
	if err := writeRun(s.db, run); err != nil {
		return fmt.Errorf("persist: close %s: record the clean close: %v (everything is in the data file; the next open will take this run as a crash)", s.opts.Path, err)
	}
	return nil
}

// finalCheckpoint writes the frozen overlay, if a checkpoint of it failed,
// then the current one, on the writer goroutine.
func (w *writer) finalCheckpoint() error {
	s := w.s
	for _, ov := range []*overlay{s.frozen, s.cur} {
		if ov == nil {
			continue
		}
		if ov == s.cur {
			ov.toGen = w.gen
		}
		if err := s.ck.write(ov); err != nil {
			return err
		}
		s.ovMu.Lock()
		if ov == s.frozen {
			s.frozen = nil
		} else {
			s.cur = newOverlay()
		}
		s.ovMu.Unlock()
		w.doneGen = ov.toGen
	}
	for _, c := range w.ckWaiters {
		c.finish(nil)
	}
	w.ckWaiters = nil
	return nil
}

// failed logs a failed commit: at most one line a second, with how many
// failed since the line before.
func (w *writer) failed(records int, err error) {
	w.failures++
	w.failuresTotal++
	if now := time.Now(); now.Sub(w.failLogged) >= time.Second {
		w.s.log.Error("commit failed", "records", records, "failed_commits", w.failures, "err", err)
		w.failures, w.failLogged = 0, now
	}
}

// recovered logs the first commit that succeeds after failures.
func (w *writer) recovered() {
	if w.failuresTotal == 0 {
		return
	}
	w.s.log.Info("commits succeed again", "failed_commits", w.failuresTotal)
	w.failures, w.failuresTotal, w.failLogged = 0, 0, time.Time{}
}
