package actor

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/persist"
)

// actor is one goroutine and the keys it owns. Every field is touched only by
// its loop, except mailbox.
type actor struct {
	e       *Engine
	id      uint16
	mailbox chan *call
	maxKeys int

	keys    map[string]*entry
	lru     entry // sentinel of the LRU list: lru.prev is the next key evict looks at
	alarms  alarmHeap
	timer   clock.Timer
	timerAt int64 // when timer fires, unix ns; 0 when it is not armed

	// Scratch reused from batch to batch.
	batch  []*call
	misses []string
	sink   int64 // keeps the loads of state.warm
	// taken is makeRoom's set of the new keys of a batch (memory mode),
	// kept between batches so that it allocates once.
	taken map[string]bool
	dirty []*entry
	wrote []bool
	// evicts are the Evict calls of the batch, run after its write (see
	// evictCalls).
	evicts []*call

	// The storage writes in flight, oldest first (queue[head:]), until
	// settle sees them done; see settle. In the durable modes each write
	// builds on the one before it (Store.SubmitAfter), so once one fails,
	// none after it reaches the store.
	queue []pendingWrite
	head  int
	spare [][]*entry // key lists of settled writes, for reuse
	// seq numbers the writes; chainStart is the first of the current chain
	// (after a rollback, the next write builds on none).
	seq, chainStart uint64
	// failed is the highest seq of a write that failed. The store's writer
	// goroutine sets it before it fails the write's calls, so that a caller
	// told of the failure finds its hits gone from its next call on.
	failed atomic.Uint64
	// pinned lists (async mode) the keys whose write failed: their hits
	// were acknowledged, so they stay in memory until a write of their
	// whole state succeeds (see pin).
	pinned []*entry
	// receipts remembers, for keys in memory that an import added up with
	// a state of another lineage, what is needed to take a later version
	// of that state without counting it twice (see importStates). Nil
	// until the first one.
	receipts map[string][]*receipt
	// damaged holds the keys not in memory whose stored state cannot be
	// decoded, each logged and counted once, until a write replaces the
	// record (insert removes the key). Bounded by the damaged records of
	// the data file.
	damaged map[string]*DamagedError
}

// receipt is what importStates remembers of a key after adding up an
// imported state of another lineage with the key's: that lineage, and
// what was imported of it (the versions joined).
type receipt struct {
	lineage uint64
	in      state
}

// pendingWrite is a storage write of the actor that settle has not seen
// done: its commit, its seq, and the keys it wrote.
type pendingWrite struct {
	commit *persist.Commit
	seq    uint64
	keys   []*entry
}

// entry is a key held in memory.
type entry struct {
	key        string
	st         state
	prev, next *entry
	// commit is the storage write holding the key's latest state, until it
	// is known to be done. A key is not evicted before: loading it again
	// from disk would read an older state.
	commit *persist.Commit
	// heapIdx is the position in the alarm heap, which holds the alarm's
	// time; -1 when no alarm is armed. An int32 next to the two flags keeps
	// an entry within 176 bytes on amd64 (an allocation size class); an
	// actor holds far fewer keys.
	heapIdx int32
	dirty   bool
	used    bool // used since it was last put at the front of the LRU list
	// pinned (async mode) says that a write of the key failed after its
	// hits were acknowledged: the store holds less than memory, so the key
	// is not evicted, and its next write is a whole state (see pin).
	pinned bool
	// saved is what the store holds of the key's log, for tail writes.
	saved saved
}

func newActor(e *Engine, id, maxKeys int) *actor {
	a := &actor{
		e:       e,
		id:      uint16(id),
		mailbox: make(chan *call, e.cfg.MailboxSize),
		maxKeys: max(maxKeys, 1),
		keys:    make(map[string]*entry),
		// The first write's seq is 1: failed (0) names none.
		chainStart: 1,
	}
	a.lru.next, a.lru.prev = &a.lru, &a.lru
	return a
}

func (a *actor) loop() {
	defer func() {
		if a.timer != nil {
			a.timer.Stop()
		}
	}()
	for {
		var fire <-chan time.Time
		if a.timerAt != 0 {
			fire = a.timer.C()
		}
		select {
		case c := <-a.mailbox:
			a.batch = append(a.batch[:0], c)
			a.drain()
			if len(a.batch) < a.e.cfg.MaxDrain {
				// Let the callers that are ready run first: their
				// checks join this batch (and its storage commit)
				// instead of each making one. On an idle node nothing
				// else is ready and this returns at once.
				runtime.Gosched()
				a.drain()
			}
			a.handle()
		case <-fire:
			a.timerAt = 0
			a.expire(a.now())
			a.rearm()
		case <-a.e.quit:
			// Decide what callers already handed over, then exit.
			for {
				a.batch = a.batch[:0]
				a.drain()
				if len(a.batch) == 0 {
					a.writePinned()
					return
				}
				a.handle()
			}
		}
	}
}

func (a *actor) now() int64 { return a.e.cfg.Clock.Now().UnixNano() }

// drain moves waiting calls from the mailbox into the batch, without blocking.
func (a *actor) drain() {
	for len(a.batch) < a.e.cfg.MaxDrain {
		select {
		case c := <-a.mailbox:
			a.batch = append(a.batch, c)
		default:
			return
		}
	}
}

// handle decides a batch of calls: it loads the keys it lacks in one read,
// decides every check, writes the changed keys in one storage write and
// acknowledges each call (after that write commits, in the durable modes).
func (a *actor) handle() {
	e := a.e
	a.settle()
	now := a.now()
	live := a.batch[:0]
	for _, c := range a.batch {
		if c.aborted.Load() || c.ctx.Err() != nil {
			// The caller is gone; record nothing for it. A caller that
			// had not given up yet may still read the outcome: it is the
			// context's error, not an empty decision.
			if err := c.ctx.Err(); err != nil {
				c.fail(fmt.Errorf("actor: %w", err))
			}
			c.ack()
			continue
		}
		if c.op == opEvict {
			a.evicts = append(a.evicts, c)
			continue
		}
		live = append(live, c)
	}
	a.batch = live
	if len(a.evicts) > 0 {
		// After the batch's write, whatever way handle returns: a key the
		// batch changed leaves memory once the store holds the change.
		defer a.evictCalls()
	}
	if len(a.batch) == 0 {
		return
	}
	if e.store != nil {
		if err := a.load(now); err != nil {
			for _, c := range a.batch {
				c.fail(err)
				c.ack()
			}
			return
		}
	} else {
		a.makeRoom(now)
	}

	checks := 0
	a.wrote = a.wrote[:0]
	for _, c := range a.batch {
		wrote := false
		if c.errValue() == nil {
			switch c.op {
			case opCheck, opRelease:
				wrote = a.decideCall(c, now, &checks)
			case opInspect:
				a.inspect(c, now)
			case opReset:
				wrote = a.reset(c, now)
			case opList:
				a.list(c)
			case opImport:
				wrote = a.importStates(c, now)
			case opCollect:
				a.collect(c, now)
			case opForget:
				wrote = a.forget(c, now)
			}
		}
		a.wrote = append(a.wrote, wrote)
	}
	e.cfg.Observer.Batch(int(a.id), checks, len(a.mailbox))
	if e.cfg.Trace {
		for _, c := range a.batch {
			if c.op == opCheck {
				traceEvent(c, "decided")
			}
		}
	}

	if e.store == nil || len(a.dirty) == 0 {
		for _, ent := range a.dirty {
			ent.dirty = false
			if !a.arm(ent, now) {
				a.remove(ent)
			}
		}
		a.dirty = a.dirty[:0]
		for _, c := range a.batch {
			c.ack()
		}
		if e.store != nil {
			a.evict()
		}
		a.rearm()
		return
	}
	a.persist(now)
	a.evict()
	a.rearm()
}

// decideCall decides (or, for opRelease, releases) the checks of c that
// this actor owns and reports whether any key changed. A fenced call routed
// at an older ownership generation is refused if one of its keys here
// moved (see Engine.Fence): an unfenced call, or one at the current
// generation, costs one comparison (and one atomic load).
func (a *actor) decideCall(c *call, now int64, checks *int) (wrote bool) {
	if c.gen != 0 && c.op == opCheck && c.gen != a.e.gen.Load() && !a.owns(c) {
		a.refuse(c)
		return false
	}
	for i := range c.checks {
		if c.shards[i] != a.id {
			continue
		}
		*checks++
		ch := &c.checks[i]
		ent := a.keys[ch.Key]
		if d := a.damaged[ch.Key]; ent == nil && d != nil {
			// Costs this check only (nothing to release for opRelease).
			if c.op == opCheck {
				c.out[i] = Decision{Err: d}
			}
			continue
		}
		if ent == nil {
			ent = a.insert(ch.Key)
		} else {
			a.touch(ent)
		}
		var changed bool
		if c.op == opRelease {
			changed = ent.st.release(c.marks[i], ch.Cost)
			if r := ch.Reservation; r != nil && !r.Settle {
				// The reserve is undone: forget it too.
				_, dropped := ent.st.takeReservation(r.ID)
				changed = changed || dropped
			}
		} else {
			if len(a.receipts) > 0 {
				a.expireReceipts(ent, now)
			}
			changed = ent.st.decide(now, ch, a.e.cfg.MaxLogRuns, &c.out[i])
			if c.marks != nil {
				c.marks[i] = ent.st.mark()
			}
		}
		if changed {
			wrote = true
			a.markDirty(ent)
		} else if !ent.dirty && ent.st.deadline() == 0 {
			a.remove(ent) // a peek at a key nobody wrote: keep nothing
		}
	}
	return wrote
}

func (a *actor) markDirty(ent *entry) {
	if !ent.dirty {
		ent.dirty = true
		a.dirty = append(a.dirty, ent)
	}
}

// inspect fills c.view with the state of its key, from memory or else from
// disk, without loading it into memory.
func (a *actor) inspect(c *call, now int64) {
	v := c.view
	v.ReadAt = time.Unix(0, now)
	if ent := a.keys[v.Key]; ent != nil {
		if !ent.st.isEmpty(now) {
			ent.st.view(now, a.e.cfg.MaxLogRuns, v)
			v.InMemory = true
		}
		return
	}
	if a.e.store == nil {
		return
	}
	if d := a.damaged[v.Key]; d != nil {
		c.fail(d)
		return
	}
	var st state
	var derr error
	found := false
	err := a.e.store.Get([]string{v.Key}, func(_ int, deadline int64, value []byte) {
		if deadline > now {
			found, derr = true, st.decode(value)
		}
	})
	switch {
	case err != nil:
		c.fail(fmt.Errorf("actor: inspect %s: %w", QuoteKey(v.Key), err))
	case derr != nil:
		c.fail(a.markDamaged(v.Key, derr))
	case found && !st.isEmpty(now):
		st.view(now, a.e.cfg.MaxLogRuns, v)
	}
}

// reset forgets the key of c. load has brought it into memory if it was
// on disk; its empty state is written as a delete.
func (a *actor) reset(c *call, now int64) bool {
	key := c.checks[0].Key
	ent := a.keys[key]
	if ent == nil && a.damaged[key] != nil {
		// A damaged record: the write of the empty state deletes it.
		ent = a.insert(key)
		c.existed = true
		a.markDirty(ent)
		return true
	}
	if ent == nil {
		return false
	}
	c.existed = !ent.st.isEmpty(now)
	ent.st = state{}
	a.markDirty(ent)
	a.dropReceipt(ent.key)
	return true
}

// list puts the keys in memory that match c into c.lists[a.id], sorted.
func (a *actor) list(c *call) {
	var out []KeySummary
	for key, ent := range a.keys {
		if strings.HasPrefix(key, c.prefix) && key > c.after && ent.st.deadline() > 0 {
			out = append(out, KeySummary{Key: key, InMemory: true, ExpiresAt: time.Unix(0, ent.st.deadline())})
		}
	}
	slices.SortFunc(out, func(x, y KeySummary) int { return strings.Compare(x.Key, y.Key) })
	if len(out) > c.limit {
		out = out[:c.limit]
	}
	c.lists[a.id] = out
}

// importStates merges the handed-over states of c into its keys.
//
// The same state may arrive twice: a sender retries a handoff whose
// answer it did not get (a timeout, a cancelled round, or this node's
// standby failing to confirm the import's copy after the import had
// committed here), and a sender whose state of a key changed after it was
// read sends the newer version later. Versions of one state share its
// lineage. Merged with a key of the same lineage they join (each hit
// once); merged with a key of another lineage they add up, and a second
// version would add up again, counting the first version's hits twice.
// So when an import adds up (the key holds hits of another lineage), the
// key keeps a receipt: the imported lineage and what was imported of it
// (the versions joined). A later import of that lineage adds up only its
// excess over the receipt (see state.excess), and the receipt takes the
// new version in: per instant (a log's timestamp, a window's bucket, a
// bucket's used tokens) the key then counts its other hits plus the larger
// of the versions, each hit of the imported history once.
//
// A receipt stays while the key changes otherwise: hits this node records
// (it may decide the key between two imports, when the sender retries a
// part whose answer was lost) are the key's own and add to what the
// excess adds. It ends with the key's state (a reset, a Forget, its hits
// all expired, leaving memory, a rollback), and once what it took in has
// expired; without it a newer version adds up again, which over-counts
// and only denies more. Receipts are in memory only, at most maxReceipts
// per key in memory, the oldest lineage giving way.
func (a *actor) importStates(c *call, now int64) (wrote bool) {
	maxRuns := a.e.cfg.MaxLogRuns
	for i := range c.checks {
		if c.shards[i] != a.id {
			continue
		}
		key := c.checks[i].Key
		var in state
		if err := in.decode(c.states[i]); err != nil {
			c.fail(fmt.Errorf("actor: import %s: %w", QuoteKey(key), err))
			continue
		}
		ent := a.keys[key]
		if ent == nil {
			ent = a.insert(key)
		}
		a.markDirty(ent) // written (and copied to the standby) again in any case
		wrote = true
		if len(a.receipts) > 0 {
			a.expireReceipts(ent, now)
		}
		adds := in.lineage != 0 && in.lineage != ent.st.lineage && in.valid() && !in.isEmpty(now) &&
			ent.st.valid() && !ent.st.isEmpty(now)
		if !adds {
			ent.st.merge(now, &in, maxRuns)
			continue
		}
		if r := a.receipt(key, in.lineage); r != nil {
			e := in.excess(now, &r.in, maxRuns)
			ent.st.merge(now, &e, maxRuns)
			r.in.merge(now, &in, maxRuns) // a join: the same lineage
			continue
		}
		ent.st.merge(now, &in, maxRuns)
		if a.receipts == nil {
			a.receipts = make(map[string][]*receipt)
		}
		rs := a.receipts[ent.key]
		if len(rs) == maxReceipts {
			rs = append(rs[:0], rs[1:]...)
		}
		a.receipts[ent.key] = append(rs, &receipt{lineage: in.lineage, in: in.clone()})
	}
	return wrote
}

// maxReceipts bounds the receipts of one key: the lineages whose imports
// it remembers (see importStates).
const maxReceipts = 4

// receipt returns key's receipt for lineage, or nil.
func (a *actor) receipt(key string, lineage uint64) *receipt {
	for _, r := range a.receipts[key] {
		if r.lineage == lineage {
			return r
		}
	}
	return nil
}

// expireReceipts ends the receipts of ent that can matter no more: all of
// them once the key holds nothing (its history ended), and each one once
// what it took in has expired (a later version of that history then
// holds only hits the key never counted).
func (a *actor) expireReceipts(ent *entry, now int64) {
	rs := a.receipts[ent.key]
	if rs == nil {
		return
	}
	if ent.st.isEmpty(now) {
		a.dropReceipt(ent.key)
		return
	}
	kept := rs[:0]
	for _, r := range rs {
		if !r.in.isEmpty(now) {
			kept = append(kept, r)
		}
	}
	clear(rs[len(kept):])
	if len(kept) == 0 {
		delete(a.receipts, ent.key)
		return
	}
	a.receipts[ent.key] = kept
}

// dropReceipt ends the receipts of key, if it has any (see importStates).
func (a *actor) dropReceipt(key string) {
	if len(a.receipts) > 0 {
		delete(a.receipts, key)
	}
}

// persist hands the batch's dirty keys to the store as one write and
// acknowledges the calls: at once in Async mode and for calls that
// recorded nothing, otherwise after the commit (and, with a Replicator,
// once the Replicator, which receives the write's records after the
// commit, confirmed them). In the durable modes the write builds on the
// actor's previous write if that one is still in flight (see settle).
func (a *actor) persist(now int64) {
	f := flushPool.Get().(*flush)
	for _, ent := range a.dirty {
		ent.dirty = false
		ent.pinned = false // this write holds its whole state (see pin)
		if !a.arm(ent, now) {
			// Empty: delete it on disk. It stays in memory, empty and
			// without an alarm, until eviction, so that nobody reads the
			// older state on disk before the delete commits.
			f.recs = append(f.recs, persist.Record{Key: ent.key})
			ent.saved = saved{}
			continue
		}
		// A sliding log that only gained hits since its last write appends
		// them (tens of bytes) to the stored value rather than rewriting the
		// whole log.
		start := len(f.buf)
		var tail bool
		if f.buf, tail = ent.st.appendTail(f.buf, &ent.saved, now); !tail {
			f.buf = ent.st.appendBinary(f.buf)
			ent.st.written(&ent.saved, len(f.buf)-start)
		}
		f.recs = append(f.recs, persist.Record{Key: ent.key, Deadline: ent.st.deadline(), Value: f.buf[start:], Append: tail})
	}
	// f.buf may have moved while growing: point the values at the final array.
	off := 0
	for i := range f.recs {
		if n := len(f.recs[i].Value); n > 0 {
			f.recs[i].Value = f.buf[off : off+n : off+n]
			off += n
		}
	}
	async := a.e.store.Mode() == persist.ModeAsync
	for i, c := range a.batch {
		if async || !a.wrote[i] {
			c.ack()
		} else {
			f.calls = append(f.calls, c)
		}
	}
	a.seq++
	f.a, f.seq = a, a.seq
	if f.storeDone == nil {
		f.storeDone, f.replicaDone = f.finishStore, f.finishReplica
	}
	// Async mode acknowledged the hits: a write never waits on another
	// one's fate there (see pin).
	var prev *persist.Commit
	if n := len(a.queue); n > a.head && !async {
		prev = a.queue[n-1].commit
	}
	commit := a.e.store.SubmitAfter(prev, f.recs, f.storeDone)
	for _, ent := range a.dirty {
		ent.commit = commit
	}
	a.queue = append(a.queue, pendingWrite{commit: commit, seq: a.seq, keys: a.dirty})
	if n := len(a.spare); n > 0 {
		a.dirty, a.spare = a.spare[n-1], a.spare[:n-1]
	} else {
		a.dirty = nil
	}
}

// settle takes the outcome of the actor's writes that are done, oldest
// first, before a batch is decided.
//
// A write that failed leaves in memory hits that the store does not hold
// and that, in the durable modes, its callers were told were not
// recorded. Every write the actor made after it was built on it (persist)
// and fails too, without reaching the store (Store.SubmitAfter): so the
// store holds each key as it was before the failed write, and rollback
// makes memory agree, by dropping every key those writes held; the next
// call on one loads it again. Checks decided on top of the failed hits
// before the failure was known counted more than there was: they only
// denied more (their writes fail too, so their own hits go as well).
//
// In async mode the callers were told their hits were recorded: they stay
// (pin).
func (a *actor) settle() {
	if a.head == len(a.queue) {
		return
	}
	async := a.e.store.Mode() == persist.ModeAsync
	// Read before the writes' status: a write that failed sets it before
	// its status is done (its done callback runs first).
	failed := !async && a.failed.Load() >= a.chainStart
	wrote := false
loop:
	for a.head < len(a.queue) {
		w := &a.queue[a.head]
		done, err := w.commit.Status()
		switch {
		case done && err == nil:
			wrote = true
		case async && done:
			a.pin(w.keys)
		case done || failed:
			a.rollback()
			return
		default:
			break loop // in flight
		}
		a.popWrite()
	}
	if wrote && len(a.pinned) > 0 {
		a.rewritePinned()
	}
}

// popWrite drops the oldest write in flight, which settle has seen done.
func (a *actor) popWrite() {
	w := &a.queue[a.head]
	clear(w.keys)
	a.spare = append(a.spare, w.keys[:0])
	*w = pendingWrite{}
	a.head++
	switch {
	case a.head == len(a.queue):
		a.queue, a.head = a.queue[:0], 0
	case a.head >= 64 && 2*a.head >= len(a.queue):
		n := copy(a.queue, a.queue[a.head:])
		clear(a.queue[n:])
		a.queue, a.head = a.queue[:n], 0
	}
}

// rollback undoes, after a write failed, that write and every write in
// flight after it, which fail too: it drops their keys from memory (unless
// a key left memory since, and is another entry now), so that the next
// call on one loads what the store holds, and starts a new chain of writes.
func (a *actor) rollback() {
	dropped := 0
	for a.head < len(a.queue) {
		for _, ent := range a.queue[a.head].keys {
			if a.keys[ent.key] == ent {
				a.remove(ent)
				dropped++
			}
		}
		a.popWrite()
	}
	a.chainStart = a.seq + 1
	a.e.cfg.Logger.Debug("dropped the keys of failed writes from memory; they load again from the store", "actor", a.id, "keys", dropped)
}

// pin keeps, in async mode, the keys of a write that failed: their hits
// were acknowledged, so memory keeps them, and, since the store does not
// hold them (an append of the write's tail was lost, and a later append
// would add to a value without it), the key's next write is a whole state,
// and the key is not evicted before such a write succeeds. Once a write
// succeeds again, settle rewrites every pinned key that is still in memory
// (rewritePinned); so does the actor when the engine closes.
func (a *actor) pin(keys []*entry) {
	for _, ent := range keys {
		if a.keys[ent.key] != ent {
			continue
		}
		ent.saved = saved{}
		if !ent.pinned {
			ent.pinned = true
			a.pinned = append(a.pinned, ent)
		}
	}
	if len(a.pinned) > 2*len(a.keys)+64 {
		// Keys that left memory (emptied) while pinned: drop them.
		kept := a.pinned[:0]
		for _, ent := range a.pinned {
			if ent.pinned {
				kept = append(kept, ent)
			}
		}
		clear(a.pinned[len(kept):])
		a.pinned = kept
	}
}

// rewritePinned marks the pinned keys still in memory dirty: the batch
// about to be decided writes their whole states.
func (a *actor) rewritePinned() {
	for _, ent := range a.pinned {
		if ent.pinned && a.keys[ent.key] == ent {
			a.markDirty(ent)
		}
	}
	clear(a.pinned)
	a.pinned = a.pinned[:0]
}

// writePinned, when the engine closes in async mode, waits for the writes
// in flight and writes the whole states of the keys whose writes failed,
// so that the store's last flush holds every acknowledged hit (unless the
// disk still fails).
func (a *actor) writePinned() {
	if a.e.store == nil || a.e.store.Mode() != persist.ModeAsync {
		return
	}
	for _, w := range a.queue[a.head:] {
		<-w.commit.Done()
	}
	a.settle()
	a.rewritePinned()
	if len(a.dirty) > 0 {
		a.batch, a.wrote = a.batch[:0], a.wrote[:0]
		a.persist(a.now())
	}
}

// load reads, in one transaction, the keys of the batch that are not in
// memory. A key whose stored deadline has passed is as good as new.
func (a *actor) load(now int64) error {
	a.misses = a.misses[:0]
	var sink int64
	for _, c := range a.batch {
		if c.op == opInspect || c.op == opCollect || c.broadcast() {
			continue // nothing to load: they read without loading, or go to every actor
		}
		for i := range c.checks {
			if c.shards[i] == a.id {
				k := c.checks[i].Key
				switch ent := a.keys[k]; {
				case ent != nil:
					// The decisions read each key's entry and log one
					// after the other, each waiting for its cache
					// misses; read here, where no load depends on the
					// one before, the misses of the batch's keys overlap.
					sink += ent.st.warm()
				case a.damaged[k] == nil:
					a.misses = append(a.misses, k)
				}
			}
		}
	}
	a.sink = sink
	if len(a.misses) == 0 {
		return nil
	}
	err := a.e.store.Get(a.misses, func(i int, deadline int64, value []byte) {
		key := a.misses[i]
		if deadline <= now || a.keys[key] != nil || a.damaged[key] != nil {
			return
		}
		ent := a.insert(key)
		if err := ent.st.decode(value); err != nil {
			a.remove(ent)
			a.markDamaged(key, err)
			return
		}
		if ent.st.algo == SlidingLog {
			// A stored chain keeps the runs that expired since its full
			// segment (see appendTail): memory holds the live ones only.
			ent.st.logPrune(now)
		}
		a.armAt(ent, deadline)
	})
	if err != nil {
		return fmt.Errorf("actor: load keys: %w", err)
	}
	return nil
}

// markDamaged notes that key's stored state cannot be decoded, and logs
// and counts it the first time, and returns the error its calls get.
func (a *actor) markDamaged(key string, err error) *DamagedError {
	if d := a.damaged[key]; d != nil {
		return d
	}
	d := &DamagedError{Key: strings.Clone(key), Err: err}
	if a.damaged == nil {
		a.damaged = make(map[string]*DamagedError)
	}
	a.damaged[d.Key] = d
	a.e.cfg.Observer.Damaged()
	a.e.cfg.Logger.Error("damaged record: the key's stored state cannot be decoded; its checks answer DATA_LOSS until it is reset", "key", QuoteKey(key), "err", err)
	return d
}

// makeRoom, in memory mode, fails the calls that would take the actor past
// its key bound, after dropping keys whose state has already emptied. The
// new keys of the calls it lets through count against the bound of the
// calls after them in the batch.
func (a *actor) makeRoom(now int64) {
	taken := a.taken // new keys of the calls let through so far
	defer func() { clear(a.taken) }()
	var sink int64
	for _, c := range a.batch {
		if c.op != opCheck {
			continue
		}
		need := 0
		for i := range c.checks {
			if c.shards[i] != a.id {
				continue
			}
			k := c.checks[i].Key
			switch ent := a.keys[k]; {
			case ent != nil:
				sink += ent.st.warm() // as in load
			case !taken[k]:
				need++
			}
		}
		if need == 0 {
			continue
		}
		if over := len(a.keys) + len(taken) + need - a.maxKeys; over > 0 {
			a.dropEmpty(now, over)
			if len(a.keys)+len(taken)+need > a.maxKeys {
				c.fail(ErrTooManyKeys)
				continue
			}
		}
		if taken == nil {
			taken = make(map[string]bool, need)
			a.taken = taken
		}
		for i := range c.checks {
			if k := c.checks[i].Key; c.shards[i] == a.id && a.keys[k] == nil {
				taken[k] = true
			}
		}
	}
	a.sink = sink
}

// dropEmpty removes up to n keys whose state is empty at now, looking at the
// least recently used ones first, and a bounded number of them.
func (a *actor) dropEmpty(now int64, n int) {
	ent := a.lru.prev
	for looked := 0; n > 0 && ent != &a.lru && looked < 256; looked++ {
		prev := ent.prev
		if ent.st.isEmpty(now) {
			a.remove(ent)
			n--
		}
		ent = prev
	}
}

// evict moves least recently used keys (approximately: see touch) out of
// memory until the actor is within its bound. Their state is on disk, unless
// a write is still in flight, in which case they wait for a later batch.
func (a *actor) evict() {
	evicted := 0
	for looked := 0; len(a.keys) > a.maxKeys; looked++ {
		ent := a.lru.prev
		if ent.used || ent.pinned && looked < len(a.keys) {
			// Used since it was last put at the front: its second chance.
			// Each pass clears the marks it meets, so the loop ends. A
			// pinned key (async mode) stays, while others can go.
			ent.used = false
			ent.prev.next, ent.next.prev = ent.next, ent.prev
			a.pushFront(ent)
			continue
		}
		if ent.pinned {
			break // it looked at every key: all are pinned
		}
		if ent.commit != nil {
			// A write in flight, or one that failed (settle deals with it
			// before the next batch), waits for a later batch.
			if done, err := ent.commit.Status(); !done || err != nil {
				break
			}
			ent.commit = nil
		}
		a.remove(ent)
		evicted++
	}
	if evicted > 0 {
		a.e.cfg.Observer.Evicted(evicted)
	}
}

// expire runs the alarms that came due: a key whose state is empty leaves
// memory (the store's janitor deletes it from disk at the same deadline); a
// key that was written since its alarm was armed is armed again for its new
// deadline. An empty key is never re-armed.
func (a *actor) expire(now int64) {
	expired := 0
	for len(a.alarms) > 0 && a.alarms[0].at <= now {
		ent := a.alarms.pop()
		if dl := ent.st.deadline(); dl > now {
			a.alarms.push(ent, dl)
			continue
		}
		if ent.commit != nil {
			if done, _ := ent.commit.Status(); !done {
				continue // leaves by eviction once its write is done
			}
		}
		a.remove(ent)
		expired++
	}
	if expired > 0 {
		a.e.cfg.Observer.Expired(expired)
	}
}

// arm arms the alarm of a key whose state changed and reports true, or
// reports false when the state is empty at now and needs no alarm.
func (a *actor) arm(ent *entry, now int64) bool {
	dl := ent.st.deadline()
	if dl == 0 || dl <= now {
		if ent.heapIdx >= 0 {
			a.alarms.remove(int(ent.heapIdx))
		}
		return false
	}
	a.armAt(ent, dl)
	return true
}

// armAt makes sure an alarm fires for ent no later than dl. A later deadline
// keeps the armed alarm: when it fires, expire re-arms it.
func (a *actor) armAt(ent *entry, dl int64) {
	switch {
	case ent.heapIdx < 0:
		a.alarms.push(ent, dl)
	case dl < a.alarms[ent.heapIdx].at:
		a.alarms.moveEarlier(int(ent.heapIdx), dl)
	}
}

// rearm points the actor's one timer at its earliest alarm, or stops it.
func (a *actor) rearm() {
	if len(a.alarms) == 0 {
		if a.timerAt != 0 {
			a.timer.Stop()
			a.timerAt = 0
		}
		return
	}
	at := a.alarms[0].at
	if at == a.timerAt {
		return
	}
	if a.timer == nil {
		a.timer = a.e.cfg.Clock.NewTimer(time.Hour)
	}
	a.timer.ResetAt(time.Unix(0, at))
	a.timerAt = at
}

func (a *actor) insert(key string) *entry {
	ent := &entry{key: strings.Clone(key), heapIdx: -1}
	delete(a.damaged, key) // the key's record is replaced
	a.keys[ent.key] = ent
	a.pushFront(ent)
	a.e.cfg.Observer.Keys(1)
	return ent
}

func (a *actor) remove(ent *entry) {
	ent.pinned = false
	a.dropReceipt(ent.key)
	delete(a.keys, ent.key)
	ent.prev.next, ent.next.prev = ent.next, ent.prev
	ent.prev, ent.next = nil, nil
	if ent.heapIdx >= 0 {
		a.alarms.remove(int(ent.heapIdx))
	}
	a.e.cfg.Observer.Keys(-1)
}

// touch marks ent used. The list is kept in order lazily, CLOCK-style:
// moving a key to the front on every use would write to its two neighbours,
// two cache misses per decision on keys that are touched at random (5% of
// the CPU at saturation); evict gives a used key at the back a second chance
// instead.
func (a *actor) touch(ent *entry) { ent.used = true }

func (a *actor) pushFront(ent *entry) {
	ent.prev, ent.next = &a.lru, a.lru.next
	a.lru.next.prev = ent
	a.lru.next = ent
}

// flush is one storage write of an actor's batch and the calls waiting for
// it. It is recycled once the write is done (and, with a Replicator,
// replicated).
type flush struct {
	recs  []persist.Record
	buf   []byte
	calls []*call

	// a is the actor that made the write, and seq the write's number.
	a   *actor
	seq uint64
	// storeDone and replicaDone are finishStore and finishReplica, bound
	// once per flush so that a write does not allocate them.
	storeDone, replicaDone func(error)
}

var flushPool = sync.Pool{New: func() any { return new(flush) }}

// finishStore runs on the store's writer goroutine once the write is
// committed or failed. A failure is noted for the actor's settle before
// any call learns of it; a committed write goes to the Replicator, if any,
// which then has the last word; a failed one is not replicated.
func (f *flush) finishStore(err error) {
	if err != nil {
		f.a.noteFailure(f.seq)
		f.acknowledge(fmt.Errorf("actor: store: %w", err))
		return
	}
	f.trace("committed")
	if rep := f.a.e.cfg.Replicator; rep != nil {
		rep.Replicate(f.recs, f.replicaDone)
		return
	}
	f.acknowledge(nil)
}

// trace adds the event to the spans of the calls of the write, when the
// engine traces.
func (f *flush) trace(event string) {
	if f.a.e.cfg.Trace {
		for _, c := range f.calls {
			traceEvent(c, event)
		}
	}
}

// traceEvent adds the event to the span of c's context, if it has one.
func traceEvent(c *call, event string) {
	trace.SpanFromContext(c.ctx).AddEvent(event)
}

// finishReplica is the Replicator's answer, after the commit.
func (f *flush) finishReplica(err error) {
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrReplication, err)
	} else {
		f.trace("copied to standby")
	}
	f.acknowledge(err)
}

// acknowledge acknowledges the calls of the write, failed with err if it
// is not nil, and recycles f.
func (f *flush) acknowledge(err error) {
	for _, c := range f.calls {
		if err != nil {
			c.fail(err)
		}
		c.ack()
	}
	f.recycle()
}

// noteFailure records, from the store's writer goroutine, that the write
// seq failed (failed only grows).
func (a *actor) noteFailure(seq uint64) {
	for {
		old := a.failed.Load()
		if seq <= old || a.failed.CompareAndSwap(old, seq) {
			return
		}
	}
}

func (f *flush) recycle() {
	clear(f.recs)
	clear(f.calls)
	f.recs, f.buf, f.calls = f.recs[:0], f.buf[:0], f.calls[:0]
	f.a = nil
	flushPool.Put(f)
}

// alarmHeap is a min-heap of the armed alarms by time, each entry knowing
// its index. An alarm's time sits beside its entry in the heap, and each
// node has alarmArity children, so that ordering the heap reads one
// contiguous array rather than the entries: at a million keys the entries
// are all over memory, and every one read on the way was a cache miss
// (docs/benchmarks.md, "How cost grows with the key space").
type alarmHeap []alarmItem

// alarmItem is one armed alarm: when it fires, and for which key.
type alarmItem struct {
	at  int64 // unix ns
	ent *entry
}

// alarmArity is the number of children of a node of the heap: four times
// an item's 16 bytes is a cache line, and the heap half as deep as a
// binary one.
const alarmArity = 4

// push arms ent's alarm for at; ent has none armed.
func (h *alarmHeap) push(ent *entry, at int64) {
	*h = append(*h, alarmItem{at: at, ent: ent})
	h.up(len(*h) - 1)
}

// pop disarms and returns the earliest alarm's entry.
func (h *alarmHeap) pop() *entry {
	ent := (*h)[0].ent
	h.remove(0)
	return ent
}

// remove disarms the alarm at index i.
func (h *alarmHeap) remove(i int) {
	old := *h
	last := len(old) - 1
	ent := old[i].ent
	if i != last {
		old[i] = old[last]
	}
	old[last] = alarmItem{}
	*h = old[:last]
	if i != last && !h.down(i) {
		h.up(i)
	}
	ent.heapIdx = -1
}

// moveEarlier sets the alarm at index i to at, no later than it was.
func (h alarmHeap) moveEarlier(i int, at int64) {
	h[i].at = at
	h.up(i)
}

// up moves the item at i towards the root until its parent is no later,
// shifting the parents it passes down into the hole it leaves.
func (h alarmHeap) up(i int) {
	it := h[i]
	for i > 0 {
		p := (i - 1) / alarmArity
		if h[p].at <= it.at {
			break
		}
		h.place(i, h[p])
		i = p
	}
	h.place(i, it)
}

// down moves the item at i towards the leaves until no child is earlier,
// and reports whether it moved.
func (h alarmHeap) down(i int) bool {
	it, start := h[i], i
	for {
		c := alarmArity*i + 1
		if c >= len(h) {
			break
		}
		m := c
		for j := c + 1; j < min(c+alarmArity, len(h)); j++ {
			if h[j].at < h[m].at {
				m = j
			}
		}
		if it.at <= h[m].at {
			break
		}
		h.place(i, h[m])
		i = m
	}
	h.place(i, it)
	return i > start
}

// place puts it at index i, and tells its entry.
func (h alarmHeap) place(i int, it alarmItem) {
	h[i] = it
	it.ent.heapIdx = int32(i)
}
