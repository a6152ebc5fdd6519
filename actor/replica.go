package actor

import (
	"context"
	"fmt"
	"strings"

	"github.com/sluice-io/sluice/persist"
)

// This file keeps copies of keys that other nodes decide (their standby's
// copies): records as a Replicator received them, written under
// ReplicaPrefix in this engine's store. They bypass the actors, which never
// hold a key with ReservedPrefix (every client call on one is refused), so
// no actor state can race with them; replica writes race only with each
// other, and the store's writer orders them: a tail is a conditional append
// (persist.Record.IfLive), which the writer applies only over a copy that
// holds something when its turn comes.

// MissingBaseError is the error of PutReplicas (and PutFollower) when
// tails (appends) arrived for keys whose copy here holds nothing to append
// to: none, or expired, or deleted by an earlier record. Those tails were
// not written; every other record was. The sender should send those keys'
// full states.
type MissingBaseError struct {
	// Keys are the keys (as sent: without ReplicaPrefix) whose tails were
	// not written, each once, in the order of their first refused tail.
	Keys []string

	what string // the call, for the message; "" is "put replicas"
}

func (e *MissingBaseError) Error() string {
	const most = 3
	quoted := make([]string, 0, most)
	for _, k := range e.Keys[:min(len(e.Keys), most)] {
		quoted = append(quoted, fmt.Sprintf("%q", k))
	}
	more := ""
	if len(e.Keys) > most {
		more = fmt.Sprintf(" and %d more", len(e.Keys)-most)
	}
	what := e.what
	if what == "" {
		what = "put replicas"
	}
	return fmt.Sprintf("actor: %s: no copy to append to for %s%s; send their full states", what, strings.Join(quoted, ", "), more)
}

// PutReplicas writes recs (as a Replicator received them: full states,
// tails, deletes; keys without the prefix) as replica copies, under
// ReplicaPrefix+key, and returns once they are committed (in async mode
// too: whether each tail had a base is known then). A tail whose replica
// has no base to append to when the store's writer comes to it (no copy,
// or an expired one: the engine's rule for a stored state) is not written:
// the error is a *MissingBaseError listing those keys (the other records
// are written).
//
// The records are checked first: a key that is empty, too long or starts
// with ReservedPrefix, a value that does not decode as a state, a put
// without a deadline refuse the call, and nothing is written. The records
// of one call are applied in order, as one storage write (all or nothing
// on a crash). Copies expire at their deadline like every key (the store's
// janitor deletes them).
//
// PutReplicas needs a data file: in memory mode it returns ErrNoStore.
func (e *Engine) PutReplicas(ctx context.Context, recs []persist.Record) error {
	return e.writeReplicas(ctx, "put replicas", recs)
}

// DeleteReplicas deletes the replica copies of keys (without the prefix),
// and returns once the deletions are committed. In memory mode there are
// no copies: it does nothing.
func (e *Engine) DeleteReplicas(ctx context.Context, keys []string) error {
	if e.store == nil {
		return nil
	}
	recs := make([]persist.Record, len(keys))
	for i, k := range keys {
		recs[i].Key = k
	}
	return e.writeReplicas(ctx, "delete replicas", recs)
}

// writeReplicas is PutReplicas and DeleteReplicas.
func (e *Engine) writeReplicas(ctx context.Context, what string, recs []persist.Record) error {
	w, err := e.submitReplicas(ctx, what, ReplicaPrefix, recs)
	if err != nil {
		return err
	}
	return w.Wait(ctx)
}

// SubmitReplicas is PutReplicas without the wait: the records are checked
// and submitted to the store, in the order of the calls (a later call's
// tails see this call's puts), and the returned ReplicaWrite waits for
// their commit. A standby that applies a stream of writes submits each as
// it arrives and answers each once it is committed, so that several are
// in flight. An error means nothing was submitted.
func (e *Engine) SubmitReplicas(ctx context.Context, recs []persist.Record) (*ReplicaWrite, error) {
	return e.submitReplicas(ctx, "put replicas", ReplicaPrefix, recs)
}

// ReplicaWrite is a replica write (SubmitReplicas) or a follower write
// (SubmitFollower) submitted to the store.
type ReplicaWrite struct {
	what   string
	prefix string           // of the stored keys: ReplicaPrefix, or none
	commit *persist.Commit  // nil: nothing to write
	recs   []persist.Record // as submitted, keys with prefix
}

// Wait returns once the write is committed (in async mode too: which tails
// had a base is known then), with PutReplicas' errors (PutFollower's for a
// follower write): the store's, or a *MissingBaseError for the tails that
// were not written. It may be called once.
func (w *ReplicaWrite) Wait(ctx context.Context) error {
	if w.commit == nil {
		return nil
	}
	select {
	case <-w.commit.Done():
	case <-ctx.Done():
		return fmt.Errorf("actor: %s: %w", w.what, ctx.Err())
	}
	if err := w.commit.Err(); err != nil {
		return fmt.Errorf("actor: %s: store: %w", w.what, err)
	}
	skipped := w.commit.Skipped()
	if len(skipped) == 0 {
		return nil
	}
	mb := &MissingBaseError{what: w.what}
	seen := make(map[string]bool, len(skipped))
	for _, i := range skipped {
		if k := w.recs[i].Key[len(w.prefix):]; !seen[k] {
			seen[k] = true
			mb.Keys = append(mb.Keys, k)
		}
	}
	return mb
}

// submitReplicas checks recs and submits them, each under prefix+key:
// ReplicaPrefix for SubmitReplicas, none for SubmitFollower.
func (e *Engine) submitReplicas(ctx context.Context, what, prefix string, recs []persist.Record) (*ReplicaWrite, error) {
	if e.store == nil {
		return nil, ErrNoStore
	}
	if e.closing.Load() {
		return nil, ErrClosed
	}
	rw := &ReplicaWrite{what: what, prefix: prefix}
	if len(recs) == 0 {
		return rw, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("actor: %s: %w", what, err)
	}
	// Check every record, and copy the values: the store reads them until
	// the commit, which may come after this returns.
	size := 0
	for i := range recs {
		if err := e.checkReplica(i, prefix, &recs[i]); err != nil {
			return nil, fmt.Errorf("actor: %s: %w (nothing was written)", what, err)
		}
		size += len(recs[i].Value)
	}
	buf := make([]byte, 0, size)
	out := make([]persist.Record, len(recs))
	now := e.cfg.Clock.Now().UnixNano()
	for i, r := range recs {
		rec := persist.Record{Key: prefix + r.Key, Deadline: r.Deadline, Append: r.Append}
		if r.Append {
			rec.IfLive = now // over a copy that has not expired
		}
		if r.Value != nil {
			start := len(buf)
			buf = append(buf, r.Value...)
			rec.Value = buf[start:len(buf):len(buf)]
		}
		out[i] = rec
	}
	rw.commit, rw.recs = e.store.Submit(out, nil), out
	return rw, nil
}

// checkReplica checks record i of a replica or follower write, whose key
// is stored under prefix+key.
func (e *Engine) checkReplica(i int, prefix string, r *persist.Record) error {
	switch {
	case r.Key == "" || len(prefix)+len(r.Key) > persist.MaxKeyLen:
		return fmt.Errorf("record %d: key of %d bytes; want 1 to %d", i, len(r.Key), persist.MaxKeyLen-len(prefix))
	case strings.HasPrefix(r.Key, ReservedPrefix):
		return fmt.Errorf("record %d (key %s): %s", i, QuoteKey(r.Key), reservedReason)
	case r.Value == nil && r.Append:
		return fmt.Errorf("record %d (key %s): an append without a value", i, QuoteKey(r.Key))
	case r.Value == nil:
		return nil
	case r.Deadline <= 0:
		return fmt.Errorf("record %d (key %s): deadline %d; a copy needs one > 0", i, QuoteKey(r.Key), r.Deadline)
	}
	var st state
	if err := st.decode(r.Value); err != nil {
		return fmt.Errorf("record %d (key %s): %w", i, QuoteKey(r.Key), err)
	}
	return nil
}

// CollectReplicas calls fn with the replica copy of every key (without the
// prefix) for which want is true, as a full state brought to now (expired
// hits dropped), with its deadline; copies that hold nothing now are
// skipped. It changes nothing. want is called while the store is read and
// must be quick; fn is called on the caller's goroutine, between reads, and
// an error from it stops CollectReplicas. It returns how many copies fn
// received.
//
// Copies are read a page at a time: a copy written or deleted meanwhile may
// be read as it was before or after. In memory mode there are no copies
// (PutReplicas keeps none): it returns 0.
func (e *Engine) CollectReplicas(ctx context.Context, want func(key string) bool, fn func(Exported) error) (int, error) {
	if e.store == nil {
		return 0, nil
	}
	const page = 1000
	n := 0
	after := ""
	for {
		if e.closing.Load() {
			return n, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return n, fmt.Errorf("actor: %w", err)
		}
		var got []Exported
		var derr error
		scanned := 0
		now := e.cfg.Clock.Now().UnixNano()
		err := e.store.Scan(ReplicaPrefix, after, page, func(stored string, deadline int64, value []byte) bool {
			scanned++
			after = stored
			key := stored[len(ReplicaPrefix):]
			if deadline <= now || !want(key) {
				return true
			}
			var st state
			if err := st.decode(value); err != nil {
				derr = fmt.Errorf("actor: collect replicas: key %s: %w", QuoteKey(key), err)
				return false
			}
			if st.algo == SlidingLog {
				st.logPrune(now) // as load does: a stored chain keeps expired runs
			}
			if !st.isEmpty(now) {
				got = append(got, Exported{Key: key, State: st.appendBinary(nil), Deadline: st.deadline()})
			}
			return true
		})
		if err != nil {
			return n, fmt.Errorf("actor: collect replicas: %w", err)
		}
		if derr != nil {
			return n, derr
		}
		for _, x := range got {
			if err := fn(x); err != nil {
				return n, err
			}
			n++
		}
		if scanned < page {
			return n, nil
		}
	}
}

// InspectReplica returns this engine's replica copy of key (the standby's
// copy of a key another node decides; see PutReplicas) as Inspect shows a
// key: Found is false if it keeps none, or none that holds hits now, and
// InMemory is always false (copies live on disk only). It reads the store
// as it is now: a replica write submitted and not yet committed is not
// seen. It changes nothing. A key that is empty, too long or reserved
// fails with an *InvalidCheckError; in memory mode there are no copies.
func (e *Engine) InspectReplica(ctx context.Context, key string) (KeyState, error) {
	v := KeyState{Key: key, ReadAt: e.cfg.Clock.Now()}
	if err := validKey(0, key, e.cfg.Limits); err != nil {
		return KeyState{}, err
	}
	if e.closing.Load() {
		return KeyState{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return KeyState{}, fmt.Errorf("actor: inspect replica: %w", err)
	}
	if e.store == nil {
		return v, nil
	}
	now := v.ReadAt.UnixNano()
	var st state
	var derr error
	found := false
	err := e.store.Get([]string{ReplicaPrefix + key}, func(_ int, deadline int64, value []byte) {
		if deadline > now {
			found, derr = true, st.decode(value)
		}
	})
	switch {
	case err != nil:
		return KeyState{}, fmt.Errorf("actor: inspect replica %s: %w", QuoteKey(key), err)
	case derr != nil:
		return KeyState{}, fmt.Errorf("actor: inspect replica %s: %w", QuoteKey(key), derr)
	case found && !st.isEmpty(now):
		st.view(now, e.cfg.MaxLogRuns, &v)
	}
	return v, nil
}

// Get returns the encoded state of each key that holds one (from memory,
// else from disk), without loading or changing anything: one Exported per
// key, in the order of keys (a key given twice once), with its deadline;
// keys that hold nothing now are left out. Each key is read by its actor,
// at one moment, not every key at the same moment. A key that is empty, too
// long or reserved fails the call with an *InvalidCheckError.
func (e *Engine) Get(ctx context.Context, keys []string) ([]Exported, error) {
	for i, k := range keys {
		if err := validKey(i, k, e.cfg.Limits); err != nil {
			return nil, err
		}
	}
	if e.closing.Load() {
		return nil, ErrClosed
	}
	found := make(map[string]Exported, len(keys))
	for start := 0; start < len(keys); start += e.cfg.Limits.MaxBatch {
		part := keys[start:min(start+e.cfg.Limits.MaxBatch, len(keys))]
		c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opCollect}
		c.checks = make([]Check, len(part))
		for i, k := range part {
			c.checks[i].Key = k
		}
		c.exports = make([][]Exported, len(e.actors))
		if err, _ := e.wait(c); err != nil {
			return nil, err
		}
		for _, list := range c.exports {
			for _, x := range list {
				found[x.Key] = x
			}
		}
	}
	out := make([]Exported, 0, len(found))
	for _, k := range keys {
		if x, ok := found[k]; ok {
			out = append(out, x)
			delete(found, k)
		}
	}
	return out, nil
}
