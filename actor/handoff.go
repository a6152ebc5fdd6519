package actor

import (
	"bytes"
	"context"
	"fmt"
	"time"
)

// Collect reads the state of every key for which moved returns true, to
// hand it over to the key's new owner (where Import merges it): fn receives
// each key's encoded state once, the keys in memory first, then the keys
// only on disk. A key whose state is empty now is skipped, and so are the
// keys with ReservedPrefix (replica copies: see CollectReplicas). Collect changes
// nothing, here or on disk, so it may be cancelled or fail at any point:
// whatever fn did not receive is still here, and so is what it did. Once
// the new owner has committed the states, Forget deletes them here.
//
// moved is called from actor goroutines and must be safe for concurrent
// use; fn is called on the caller's goroutine, and an error from it stops
// Collect. Collect returns how many states fn received.
//
// Each key is read at one moment, not every key at the same moment: a key
// may change after it was read (a check, an Import), and Forget then keeps
// it. After Fence, no fenced check on a moved key is decided after Collect
// read it (see Fence): Collect first waits for the fenced reserving calls
// made at an older generation to finish.
func (e *Engine) Collect(ctx context.Context, moved func(key string) bool, fn func(Exported) error) (int, error) {
	if e.closing.Load() {
		return 0, ErrClosed
	}
	if err := e.reserving.wait(ctx, e.gen.Load()); err != nil {
		return 0, err
	}
	n := 0
	// Keys read from memory that were evicted to disk since are not read
	// twice.
	seen := make(map[string]struct{})
	emit := func(c *call) error {
		for _, list := range c.exports {
			for _, x := range list {
				if _, ok := seen[x.Key]; ok {
					continue
				}
				seen[x.Key] = struct{}{}
				if err := fn(x); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	}
	c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opCollect, moved: moved}
	c.exports = make([][]Exported, len(e.actors))
	if err, _ := e.wait(c); err != nil {
		return n, err
	}
	if err := emit(c); err != nil || e.store == nil {
		return n, err
	}
	// Keys only on disk: page through the store, then ask each key's actor,
	// which reads it from memory if it was loaded since, or from disk.
	const page = 1000
	after := ""
	for {
		if e.closing.Load() {
			return n, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return n, fmt.Errorf("actor: %w", err)
		}
		var keys []Check
		scanned := 0
		now := e.cfg.Clock.Now().UnixNano()
		err := e.scanKeys("", after, page, func(key string, deadline int64) bool {
			scanned++
			after = key
			if _, ok := seen[key]; !ok && deadline > now && moved(key) {
				keys = append(keys, Check{Key: key})
			}
			return true
		})
		if err != nil {
			return n, fmt.Errorf("actor: collect: %w", err)
		}
		for start := 0; start < len(keys); start += e.cfg.Limits.MaxBatch {
			part := keys[start:min(start+e.cfg.Limits.MaxBatch, len(keys))]
			c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opCollect, checks: part}
			c.exports = make([][]Exported, len(e.actors))
			if err, _ := e.wait(c); err != nil {
				return n, err
			}
			if err := emit(c); err != nil {
				return n, err
			}
		}
		if scanned < page {
			return n, nil
		}
	}
}

// Forget deletes handed-over keys here, in memory and on disk, once their
// new owner has committed the states Collect read: a key whose state is
// still x.State, or that holds nothing, is deleted; a key whose state
// changed since Collect read it (hits recorded, an Import) is kept, and
// needs handing over again. A state counts as unchanged if it encodes to
// x.State, or to the same bytes once both are brought to now (hits that
// have expired since dropped, as loading a key from disk does).
//
// Each actor's share of a call is decided at one moment and written as one
// storage write; in the durable modes Forget returns once the deletions are
// committed. It returns how many keys hold nothing here now (deleted, or
// empty already). A Forget that fails (a cancelled context, ErrOverloaded,
// ErrClosed) may have deleted some of the keys and not others; it may be
// called again.
func (e *Engine) Forget(ctx context.Context, keys []Exported) (forgotten int, err error) {
	if e.closing.Load() {
		return 0, ErrClosed
	}
	for start := 0; start < len(keys); start += e.cfg.Limits.MaxBatch {
		part := keys[start:min(start+e.cfg.Limits.MaxBatch, len(keys))]
		c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opForget}
		c.checks = make([]Check, len(part))
		c.states = make([][]byte, len(part))
		for i, x := range part {
			if err := validKey(start+i, x.Key, e.cfg.Limits); err != nil {
				return forgotten, err
			}
			c.checks[i].Key, c.states[i] = x.Key, x.State
		}
		if err, _ := e.wait(c); err != nil {
			return forgotten, err
		}
		forgotten += int(c.count.Load())
	}
	return forgotten, nil
}

// collect reads the keys of c that move (every key in memory for which
// c.moved is true, or c's own keys, from memory or else from disk) into
// c.exports[a.id]. It changes nothing.
func (a *actor) collect(c *call, now int64) {
	add := func(key string, st *state) {
		if !st.isEmpty(now) {
			c.exports[a.id] = append(c.exports[a.id], Exported{Key: key, State: st.appendBinary(nil), Deadline: st.deadline(),
				Parts: a.parts(key, st, now)})
		}
	}
	if c.moved != nil {
		for key, ent := range a.keys {
			if c.moved(key) {
				add(key, &ent.st)
			}
		}
		return
	}
	var disk []string
	for i := range c.checks {
		if c.shards[i] != a.id {
			continue
		}
		if ent := a.keys[c.checks[i].Key]; ent != nil {
			add(ent.key, &ent.st)
		} else {
			disk = append(disk, c.checks[i].Key)
		}
	}
	if len(disk) == 0 || a.e.store == nil {
		return
	}
	err := a.e.store.Get(disk, func(i int, deadline int64, value []byte) {
		if deadline <= now || a.damaged[disk[i]] != nil {
			return
		}
		var st state
		if err := st.decode(value); err != nil {
			// Its hits are lost already: it costs this key only, logged
			// and counted, and is not handed over.
			a.markDamaged(disk[i], err)
			return
		}
		if st.algo == SlidingLog {
			st.logPrune(now) // as load does: a stored chain keeps expired runs
		}
		add(disk[i], &st)
	})
	if err != nil {
		c.fail(fmt.Errorf("actor: collect keys: %w", err))
	}
}

// forget deletes the keys of c that still hold c.states[i], or nothing,
// and adds how many to c.count. load has brought the keys on disk into
// memory; a deleted key's empty state is written as a delete.
func (a *actor) forget(c *call, now int64) (wrote bool) {
	n := int32(0)
	for i := range c.checks {
		if c.shards[i] != a.id {
			continue
		}
		ent := a.keys[c.checks[i].Key]
		if ent != nil && !ent.st.isEmpty(now) && !sameState(&ent.st, c.states[i], now, a.e.cfg.MaxLogRuns) {
			continue // changed since it was collected: keep it
		}
		n++
		if ent != nil {
			ent.st = state{}
			a.markDirty(ent)
			a.dropReceipt(ent.key)
			wrote = true
		}
	}
	c.count.Add(n)
	return wrote
}

// parts splits st, the state of key, by history when the key holds
// receipts (see Exported.Parts): its own hits beyond every history it
// took in, then each of those as taken in. It returns nil when the key
// has no receipt, or none of them counts anything any more.
func (a *actor) parts(key string, st *state, now int64) [][]byte {
	rs := a.receipts[key]
	if len(rs) == 0 {
		return nil
	}
	maxRuns := a.e.cfg.MaxLogRuns
	own := st.clone()
	var taken [][]byte
	for _, r := range rs {
		if r.in.isEmpty(now) {
			continue
		}
		own = own.excess(now, &r.in, maxRuns)
		taken = append(taken, r.in.appendBinary(nil))
	}
	if len(taken) == 0 {
		return nil
	}
	out := make([][]byte, 0, 1+len(taken))
	if own.valid() {
		out = append(out, own.appendBinary(nil))
	}
	return append(out, taken...)
}

// sameState reports whether st holds the state encoded in b: the same
// encoding, or the same once both are brought to now by a peek (expired
// hits pruned, buckets moved, tokens refilled), which changes how a state
// is written but not what it counts.
func sameState(st *state, b []byte, now int64, maxRuns int) bool {
	if bytes.Equal(st.appendBinary(nil), b) {
		return true
	}
	var x state
	if x.decode(b) != nil || x.algo != st.algo || x.limit != st.limit || x.window != st.window {
		return false
	}
	y := st.clone()
	probe := Check{Limit: x.limit, Window: time.Duration(x.window), Algorithm: x.algo}
	var d Decision
	x.decide(now, &probe, maxRuns, &d)
	y.decide(now, &probe, maxRuns, &d)
	return bytes.Equal(x.appendBinary(nil), y.appendBinary(nil))
}
