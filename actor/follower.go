package actor

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/persist"
)

// This file keeps a follower's copies of keys: the keys of a partition
// another node leads, written under their own keys in this engine's store
// (PutFollower), so that once this node leads the partition its actors
// load them from the store on first use, as any key on disk. The writes
// bypass the actors, so the caller keeps the actors off those keys while
// it follows, and drops from memory what they still hold of them (Evict)
// before they decide them again.

// PutFollower writes recs (as a Replicator received them: full states,
// tails, deletes) under their own keys, and returns once they are
// committed. It is PutReplicas without ReplicaPrefix: the same checks
// (nothing is written if one fails), values copied, a tail written only
// over a key that holds something live when the store's writer comes to it
// (the others are reported in a *MissingBaseError), a record without a
// value a delete, the records of a call applied in order as one storage
// write. In memory mode it returns ErrNoStore.
//
// The records bypass the actors, which hold keys in memory and write them
// without reading the store again. So the caller guarantees that no actor
// of this engine decides those keys while they are written this way: this
// node does not lead their partition, and it fenced the engine (Fence)
// when it stopped leading it. And it calls Evict for those keys before its
// actors decide them again: an actor that still holds one in memory (since
// this node led the partition, or since a call on the key) would decide
// from a state older than the store's, and its next write would replace
// the store's state, or append a tail to a value it does not extend.
func (e *Engine) PutFollower(ctx context.Context, recs []persist.Record) error {
	w, err := e.SubmitFollower(ctx, recs)
	if err != nil {
		return err
	}
	return w.Wait(ctx)
}

// SubmitFollower is PutFollower without the wait, as SubmitReplicas is
// PutReplicas': the records are checked and submitted in the order of the
// calls, and the returned ReplicaWrite waits for their commit. An error
// means nothing was submitted. PutFollower's contract holds: no actor
// decides the keys meanwhile, and Evict drops them before one does.
func (e *Engine) SubmitFollower(ctx context.Context, recs []persist.Record) (*ReplicaWrite, error) {
	return e.submitReplicas(ctx, "put follower", "", recs)
}

// Evict drops from memory, in every actor, the keys for which drop returns
// true, so that the next call on one loads it from the store: after
// PutFollower wrote them, before the actors decide them again. It changes
// nothing in the store, and returns how many keys left memory.
//
// It is one call to every actor, taken in turn with its other calls (as
// Collect's): an actor drops the keys after it has decided the calls that
// arrived before or with Evict's, and decides the calls that arrive after
// from what it loads. A key whose latest write is not committed yet leaves
// memory only once it is: the actor waits for that commit (deciding
// nothing meanwhile), since a load before it would read the store without
// the write. A key whose write failed leaves too, as after any failed
// commit (see doc.go): it loads again as the store holds it. A key's alarm
// goes with it; and so does the actor's note of a damaged stored record,
// which PutFollower may have replaced: the key is read again.
//
// In async mode, a key whose write failed after its hits were acknowledged
// stays in memory (the store lacks those hits until a write of the key's
// whole state succeeds, which the actor makes once writes succeed again):
// Evict then returns an error that says how many stayed, and may be
// called again. A cancelled context stops the waits: the keys whose
// writes were not done stay, and Evict returns the context's error.
//
// drop is called on actor goroutines, for every key in memory and every
// damaged record noted, and must be quick and safe for concurrent use.
// In memory mode, a key dropped would lose its hits: Evict returns
// ErrNoStore and drops nothing.
func (e *Engine) Evict(ctx context.Context, drop func(key string) bool) (int, error) {
	if e.store == nil {
		return 0, ErrNoStore
	}
	if e.closing.Load() {
		return 0, ErrClosed
	}
	c := &call{done: make(chan struct{}, 1), ctx: ctx, op: opEvict, moved: drop}
	err, _ := e.wait(c)
	return int(c.count.Load()), err
}

// evictCalls runs the Evict calls of the batch, after the batch's write
// was submitted, and acknowledges them.
func (a *actor) evictCalls() {
	for _, c := range a.evicts {
		a.evictKeys(c)
		c.ack()
	}
	clear(a.evicts)
	a.evicts = a.evicts[:0]
	a.rearm() // the dropped keys' alarms are gone
}

// evictKeys drops the keys of c (c.moved) from memory once the store holds
// what memory holds of them, and adds how many to c.count.
func (a *actor) evictKeys(c *call) {
	var keys []*entry
	for key, ent := range a.keys {
		if c.moved(key) {
			keys = append(keys, ent)
		}
	}
	for key := range a.damaged {
		if c.moved(key) {
			delete(a.damaged, key)
		}
	}
	// Wait for the writes in flight that hold the keys' latest states,
	// then take their outcome as the next batch would: a failed write's
	// keys are dropped (durable modes) or pinned (async mode).
wait:
	for _, ent := range keys {
		if ent.commit == nil {
			continue
		}
		select {
		case <-ent.commit.Done():
		case <-c.ctx.Done():
			c.fail(fmt.Errorf("actor: evict: %w", c.ctx.Err()))
			break wait
		}
	}
	a.settle()
	dropped, kept := int32(0), 0
	for _, ent := range keys {
		if a.keys[ent.key] != ent {
			dropped++ // by settle, its write having failed
			continue
		}
		if ent.pinned || ent.dirty {
			kept++ // the store lacks what memory holds (see pin)
			continue
		}
		if ent.commit != nil {
			if done, err := ent.commit.Status(); !done || err != nil {
				kept++ // not done: the context ended the wait
				continue
			}
		}
		a.remove(ent)
		dropped++
	}
	c.count.Add(dropped)
	if kept > 0 {
		c.fail(fmt.Errorf("actor: evict: %d keys stay in memory: the store lacks their latest state (in async mode, a write of theirs failed after its hits were acknowledged, until one succeeds); call again", kept))
	}
}
