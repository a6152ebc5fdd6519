package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
	"github.com/sluice-io/sluice/shard"
)

// This file is the data plane of a cluster with partitions (the map has
// partition records: see control/partition.go). Where a key's state lives
// is its partition's replica list, which changes only on purpose; who
// decides it is the partition's leader, which the map moves among the
// in-sync replicas when a leader stops, crashes or hands it over. A
// restart then moves leadership, not data:
//
//   - A leader decides a key only while it holds its lease, its applied map
//     names it leader of the key's partition, it has dropped from memory
//     what its actors held of the partition's keys since it last led it
//     (ready), and it has not stopped the partition to hand it over.
//   - Every write is copied to the partition's other in-sync replicas
//     before it is acknowledged; they write it under the real key, so a
//     follower that becomes leader reads its keys from its store, as a
//     restarted node does, with no per-key work.
//   - A follower that missed writes (it was down) is out of the in-sync
//     set: its leader pauses the partition for as long as it takes to read
//     its keys, queues their states to it, then copies every later write
//     to it too, and asks the map to admit it once it has them all.
//   - On SIGTERM a node stops the partitions it leads, waits for their
//     calls in flight, and ends its epoch with one map entry that hands
//     each to an in-sync replica; when it is back and in sync, the leaders
//     hand its preferred partitions back.

// partOf returns the record of key's partition.
func (c *config) partOf(key string) *control.Partition {
	return &c.parts[shard.Partition(shard.Hash(key), len(c.parts))]
}

// leaderOf is acting with partitions: the leader of key's partition, or,
// when it has none, the in-sync replica it waits for.
func (c *config) leaderOf(key string) (name, waitOn string, err error) {
	p := shard.Partition(shard.Hash(key), len(c.parts))
	rec := &c.parts[p]
	if rec.Leader != "" {
		return c.names[rec.Leader], "", nil
	}
	w := c.names[rec.ISR[0].ID]
	return "", w, fmt.Errorf("%w: partition %d has no leader: %s, its only replica known to hold every acknowledged hit, is down; its keys wait for it (or for `sluice members forget %s`)",
		ErrOwnerDown, p, w, w)
}

// followerOf is standby with partitions: the first other live in-sync
// replica of key's partition, "" if none.
func (c *config) followerOf(key string) string {
	rec := c.partOf(key)
	for _, x := range rec.ISR {
		if name := c.names[x.ID]; x.ID != rec.Leader && c.up(name) {
			return name
		}
	}
	return ""
}

// partState is what this node does with one partition.
type partState struct {
	// ready is the leader epoch at which this node leads the partition and
	// may decide it (its keys dropped from the actors' memory since it
	// gained it); 0 when it does not.
	ready atomic.Uint64
	// stopped is set while this node hands the partition over or pauses
	// it to bring a follower up to date: it decides none of its keys.
	stopped atomic.Bool
	// inflight counts the calls admitted on the partition and not yet
	// answered.
	inflight atomic.Int64
}

// partitions is the router's partition state.
type partitions struct {
	// state is per partition, made before the first ownership with
	// partitions is published (the count never changes): whoever loads
	// that ownership finds it.
	once  sync.Once
	state []partState

	// upd orders partsUpdated; applied and appliedEpoch are the map
	// version and epoch it followed last.
	upd          sync.Mutex
	applied      uint64
	appliedEpoch uint64

	mu sync.Mutex
	// changed is closed (and replaced) whenever a partition becomes ready
	// or resumes.
	changed chan struct{}
	// gaining are partitions whose keys are being dropped from memory.
	gaining map[int]uint64
	// catching are the followers being brought up to date, by partition:
	// every write of the partition is copied to them too, uncounted.
	catching map[int]map[string]*catchUp
	// shrinking are in-sync replicas whose removal was proposed, by
	// partition.
	shrinking map[int]map[string]bool
	// busy is set while a transfer or a catch-up runs (one at a time).
	busy bool
	kick chan struct{}
}

// catchUp is a follower being brought up to date on a partition.
type catchUp struct {
	epoch uint64 // the follower's epoch
	// broken is set when a copy to it failed: it lacks a write.
	broken atomic.Bool
	// counted is set once its admission is proposed: from then on a
	// write waits for its answer too. proposed is when (Unix ns).
	counted  atomic.Bool
	proposed atomic.Int64
}

func (ps *partitions) init() {
	ps.changed = make(chan struct{})
	ps.gaining = make(map[int]uint64)
	ps.catching = make(map[int]map[string]*catchUp)
	ps.shrinking = make(map[int]map[string]bool)
	ps.kick = make(chan struct{}, 1)
}

// size makes the per-partition state for n partitions, once.
func (ps *partitions) size(n int) {
	ps.once.Do(func() { ps.state = make([]partState, n) })
}

// broadcast wakes the calls that wait for a partition.
func (ps *partitions) broadcast() {
	ps.mu.Lock()
	close(ps.changed)
	ps.changed = make(chan struct{})
	ps.mu.Unlock()
}

func (ps *partitions) waitChan() <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.changed
}

// partsUpdated follows a new ownership with partitions: it fences the
// engine if this node stopped leading a partition, and makes the
// partitions it gained ready once their keys are dropped from memory (a
// key its actors loaded while another node led it may be older than what
// that leader copied here since).
func (r *Router) partsUpdated(next *ownership) {
	c := next.cur
	if c.parts == nil {
		return
	}
	ps := &r.parts
	// Two updates may finish in either order: the older one's map is
	// skipped.
	ps.upd.Lock()
	defer ps.upd.Unlock()
	if c.m.Version < ps.applied || c.m.Version == ps.applied && next.epoch == ps.appliedEpoch {
		return
	}
	ps.applied, ps.appliedEpoch = c.m.Version, next.epoch
	self := c.members[r.cfg.Self]
	lost := false
	gained := make(map[int]uint64)
	for p := range c.parts {
		rec := &c.parts[p]
		st := &ps.state[p]
		leads := rec.Leader != "" && rec.Leader == self.ID && next.epoch != 0 && self.Epoch == next.epoch
		if !leads {
			if st.ready.Swap(0) != 0 {
				lost = true
			}
			st.stopped.Store(false)
			continue
		}
		if st.ready.Load() != rec.LeaderEpoch {
			if st.ready.Swap(0) != 0 {
				lost = true
			}
			st.stopped.Store(false)
			gained[p] = rec.LeaderEpoch
		}
	}
	if lost {
		r.cfg.Engine.Fence()
	}
	ps.mu.Lock()
	var todo []int
	for p, e := range gained {
		if ps.gaining[p] != e {
			ps.gaining[p] = e
			todo = append(todo, p)
		}
	}
	for p, m := range ps.catching {
		if ps.state[p].ready.Load() == 0 && ps.gaining[p] == 0 {
			delete(ps.catching, p)
			continue
		}
		for name := range m {
			if c.parts[p].InSync(c.members[name].ID) {
				delete(m, name) // admitted: it gets the writes as an in-sync replica
			}
		}
	}
	ps.mu.Unlock()
	if len(todo) > 0 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.gain(todo, len(c.parts))
		}()
	}
	kick(ps.kick)
}

// gain drops the keys of partitions this node now leads from its actors'
// memory, then marks them ready at the leader epoch it gained them at, if
// it still leads them at that epoch.
func (r *Router) gain(parts []int, n int) {
	set := make(map[int]bool, len(parts))
	for _, p := range parts {
		set[p] = true
	}
	for attempt := 0; ; attempt++ {
		_, err := r.cfg.Engine.Evict(context.Background(), func(key string) bool {
			return set[shard.Partition(shard.Hash(key), n)]
		})
		if err == nil || errors.Is(err, actor.ErrNoStore) {
			break
		}
		if errors.Is(err, actor.ErrClosed) {
			return
		}
		r.log.Warn("drop the keys of gained partitions from memory", "partitions", len(parts), "err", err)
		time.Sleep(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second))
	}
	ps := &r.parts
	own := r.own.Load()
	self := own.cur.members[r.cfg.Self]
	ps.mu.Lock()
	for _, p := range parts {
		e := ps.gaining[p]
		delete(ps.gaining, p)
		rec := &own.cur.parts[p]
		if rec.Leader == self.ID && rec.LeaderEpoch == e && own.epoch == self.Epoch {
			ps.state[p].ready.Store(e)
		}
	}
	ps.mu.Unlock()
	r.log.Info("leading partitions", "partitions", len(parts))
	ps.broadcast()
	kick(ps.kick)
}

// admitParts admits checks on this node's partitions: each partition must
// be led here and ready, and not stopped. A partition that is gaining or
// paused is waited for, up to HandoffWait; one whose leadership moved
// meanwhile sends the call back to be routed again (ErrStale). On success
// the call counts as in flight on its partitions until done is called; a
// call that waits does not (a pause waits for the calls in flight).
func (r *Router) admitParts(ctx context.Context, own *ownership, checks []actor.Check) (done func(), err error) {
	ps := &r.parts
	n := len(own.cur.parts)
	var buf [4]int
	parts := buf[:0]
	for i := range checks {
		p := shard.Partition(shard.Hash(checks[i].Key), n)
		if !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	done = func() {
		for _, p := range parts {
			ps.state[p].inflight.Add(-1)
		}
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		// Counted first, checked after: a pause that sets stopped, then
		// finds no call in flight, has no call admitted behind it.
		for _, p := range parts {
			ps.state[p].inflight.Add(1)
		}
		why := ""
		for _, p := range parts {
			st, rec := &ps.state[p], &own.cur.parts[p]
			switch {
			case own.cur.names[rec.Leader] != r.cfg.Self:
				done()
				return nil, fmt.Errorf("%w: %s no longer leads partition %d", actor.ErrStale, r.cfg.Self, p)
			case len(rec.ISR) < own.cur.m.MinInsync:
				done()
				return nil, fmt.Errorf("%w: partition %d has %d in-sync replicas, fewer than --min-insync %d: it decides nothing until a replica is back in sync",
					ErrOwnerDown, p, len(rec.ISR), own.cur.m.MinInsync)
			case st.ready.Load() != rec.LeaderEpoch:
				why = fmt.Sprintf("%s is taking partition %d over", r.cfg.Self, p)
			case st.stopped.Load():
				why = fmt.Sprintf("partition %d is paused on %s", p, r.cfg.Self)
			}
			if why != "" {
				break
			}
		}
		if why == "" {
			return done, nil
		}
		wake := ps.waitChan()
		done()
		if t == nil {
			t = time.NewTimer(r.cfg.HandoffWait)
		}
		select {
		case <-wake:
		case <-own.changed:
			// A newer map: the call goes on waiting here if this node
			// still leads its partitions in it (a catch-up's admissions
			// change the map many times over), else it is routed again.
			next := r.own.Load()
			if next.epoch != own.epoch || next.cur.parts == nil {
				return nil, fmt.Errorf("%w: the map changed", actor.ErrStale)
			}
			own = next
		case <-t.C:
			return nil, fmt.Errorf("%w: %s", ErrMoving, why)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %s", ErrMoving, why)
		}
	}
}

// partDecidable is Decidable with partitions.
func (r *Router) partDecidable(own *ownership, key string) bool {
	p := shard.Partition(shard.Hash(key), len(own.cur.parts))
	rec := &own.cur.parts[p]
	st := &r.parts.state[p]
	return own.cur.names[rec.Leader] == r.cfg.Self && st.ready.Load() == rec.LeaderEpoch && !st.stopped.Load()
}

// replicateParts is Replicate with partitions: each record of a partition
// this node leads goes to the partition's other in-sync replicas, whose
// answers the write waits for, and to the followers being brought up to
// date, whose answers it waits for only once their admission is proposed
// (I2: the maximal in-sync set).
func (r *Router) replicateParts(own *ownership, recs []persist.Record, done func(error)) {
	c := own.cur
	var (
		buf   [4]replPart
		parts = buf[:0]
		cus   []*catchUp // per part: the catch-up it belongs to, nil for an in-sync replica
	)
	add := func(name string, cu *catchUp, p int, rec persist.Record) {
		j := 0
		for j < len(parts) && (parts[j].standby != name || cus[j] != cu) {
			j++
		}
		if j == len(parts) {
			parts = append(parts, replPart{standby: name, optional: cu != nil && !cu.counted.Load()})
			cus = append(cus, cu)
		}
		parts[j].recs = append(parts[j].recs, rec)
		parts[j].parts = appendPart(parts[j].parts, p)
	}
	ps := &r.parts
	ps.mu.Lock()
	// The newest ownership, read under the lock: a follower whose catch-up
	// partsUpdated ended (under the lock, after publishing the map that
	// admits it) is in sync in it.
	own = r.own.Load()
	c = own.cur
	self := c.members[r.cfg.Self]
	for _, rec := range recs {
		p := shard.Partition(shard.Hash(rec.Key), len(c.parts))
		pr := &c.parts[p]
		if pr.Leader != self.ID {
			continue // a key this node does not lead: nothing to copy
		}
		for _, x := range pr.ISR {
			if x.ID != self.ID {
				add(c.names[x.ID], nil, p, rec)
			}
		}
		for name, cu := range ps.catching[p] {
			if !pr.InSync(c.members[name].ID) {
				add(name, cu, p, rec)
			}
		}
	}
	ps.mu.Unlock()
	if len(parts) == 0 {
		done(nil)
		return
	}
	w := &replWrite{done: done}
	counted := int32(1) // finished below, once every part is queued
	for _, pt := range parts {
		if !pt.optional {
			counted++
		}
	}
	w.left.Store(counted)
	deadline := time.Now().Add(r.cfg.ReplicaTimeout)
	for i, pt := range parts {
		if pt.optional {
			// The write does not wait for this part, and the engine reuses
			// its records' buffers once the write is done: the part sends
			// copies.
			pt.recs = copyRecords(pt.recs)
		}
		it := &replItem{recs: pt.recs, w: w, deadline: deadline, epoch: own.epoch, optional: pt.optional}
		name, touched := pt.standby, pt.parts
		if cu := cus[i]; cu != nil {
			it.note = func(err error) {
				if err != nil {
					cu.broken.Store(true)
				}
			}
		} else {
			// An in-sync replica that does not confirm is taken out of the
			// in-sync sets; the write stands once the map says so (I2: a
			// removal counts once committed).
			it.optional = true
			it.note = func(err error) {
				if err == nil {
					w.finish(nil)
					return
				}
				r.shrink(touched, name)
				r.wg.Add(1)
				go func() {
					defer r.wg.Done()
					w.finish(r.waitOutOfSync(touched, name, deadline.Add(r.cfg.ReplicaTimeout), err))
				}()
			}
		}
		s, err := r.standbySender(own, name)
		if err != nil {
			it.finish(fmt.Errorf("%w: %s: %v", errStandby, name, err))
			continue
		}
		s.lanes[laneOf(pt.recs[0].Key)].enqueue(it)
	}
	w.finish(nil)
}

// waitOutOfSync waits until this node's map has name out of the in-sync
// sets of parts, and returns nil then; failed if until comes first.
func (r *Router) waitOutOfSync(parts []int, name string, until time.Time, failed error) error {
	for {
		m, changed := r.ctl().Watch()
		x, ok := m.Member(name)
		out := true
		for _, p := range parts {
			if p < len(m.Partitions) && ok && m.Partitions[p].InSync(x.ID) {
				out = false
			}
		}
		if out {
			for _, p := range parts {
				if p < len(m.Partitions) && len(m.Partitions[p].ISR) < m.MinInsync {
					return fmt.Errorf("%w; partition %d is left with %d in-sync replicas, fewer than --min-insync %d", failed, p, len(m.Partitions[p].ISR), m.MinInsync)
				}
			}
			return nil
		}
		wait := time.Until(until)
		if wait <= 0 {
			return failed
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// copyRecords returns recs with values of their own.
func copyRecords(recs []persist.Record) []persist.Record {
	size := 0
	for _, r := range recs {
		size += len(r.Value)
	}
	buf := make([]byte, 0, size)
	out := make([]persist.Record, len(recs))
	for i, r := range recs {
		out[i] = r
		if r.Value != nil {
			start := len(buf)
			buf = append(buf, r.Value...)
			out[i].Value = buf[start:len(buf):len(buf)]
		}
	}
	return out
}

// appendPart adds p to ps once.
func appendPart(ps []int, p int) []int {
	if slices.Contains(ps, p) {
		return ps
	}
	return append(ps, p)
}

// shrink asks the map to take the in-sync replica name out of the in-sync
// sets of parts: a copy to it failed, and writes cannot wait for it. Until
// the map says so, the writes of those partitions fail (I2: a removal
// counts once committed).
func (r *Router) shrink(parts []int, name string) {
	ps := &r.parts
	own := r.own.Load()
	c := own.cur
	x, ok := c.members[name]
	if !ok || c.parts == nil {
		return
	}
	ps.mu.Lock()
	var changes []control.PartitionChange
	for _, p := range parts {
		rec := &c.parts[p]
		i := slices.IndexFunc(rec.ISR, func(y control.Incarnation) bool { return y.ID == x.ID })
		if i < 0 || ps.shrinking[p][name] || len(rec.ISR) < 2 {
			continue
		}
		if ps.shrinking[p] == nil {
			ps.shrinking[p] = make(map[string]bool)
		}
		ps.shrinking[p][name] = true
		changes = append(changes, control.PartitionChange{P: p, Version: rec.Version, LeaderEpoch: rec.LeaderEpoch,
			ISR: slices.Delete(slices.Clone(rec.ISR), i, i+1)})
	}
	ps.mu.Unlock()
	if len(changes) == 0 {
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := r.ctl().ChangeISR(ctx, changes)
		if err != nil {
			r.log.Warn("take a replica out of the in-sync sets", "replica", name, "partitions", len(changes), "err", err)
		} else {
			r.log.Info("took a replica out of the in-sync sets: a copy to it failed", "replica", name, "partitions", len(changes))
		}
		ps.mu.Lock()
		for _, ch := range changes {
			delete(ps.shrinking[ch.P], name)
		}
		ps.mu.Unlock()
	}()
}

// checkFollower refuses a call of copies from a node that does not lead
// every record's partition in this node's map, or of a partition this node
// leads (I1: a leader that lost its partition is fenced here).
func (r *Router) checkFollower(own *ownership, from string, recs []persist.Record) error {
	c := own.cur
	x, ok := c.members[from]
	if !ok {
		return fmt.Errorf("%w: %s is not a member", errWrongEpoch, from)
	}
	for _, rec := range recs {
		p := shard.Partition(shard.Hash(rec.Key), len(c.parts))
		if l := c.parts[p].Leader; l != x.ID {
			return fmt.Errorf("%w: %s does not lead partition %d in %s's map (version %d): %s does",
				errWrongEpoch, from, p, r.cfg.Self, c.m.Version, c.names[l])
		}
	}
	return nil
}

// partitionLoop brings the followers of the partitions this node leads up
// to date and asks the map to admit them, and hands each partition back to
// its preferred leader once that one is in sync, until ctx ends.
func (r *Router) partitionLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.parts.kick:
		case <-t.C:
		}
		own := r.own.Load()
		if own == nil || own.cur.parts == nil || own.epoch == 0 {
			continue
		}
		if err := r.catchUpFollowers(ctx, own); err != nil && ctx.Err() == nil {
			r.log.Warn("bring followers up to date", "err", err)
		}
		if err := r.prefer(ctx, own); err != nil && ctx.Err() == nil {
			r.log.Warn("hand partitions to their preferred leaders", "err", err)
		}
	}
}

// led returns the partitions this node leads and may decide in own.
func (r *Router) led(own *ownership) []int {
	self := own.cur.members[r.cfg.Self]
	var out []int
	for p := range own.cur.parts {
		rec := &own.cur.parts[p]
		if rec.Leader == self.ID && r.parts.state[p].ready.Load() == rec.LeaderEpoch {
			out = append(out, p)
		}
	}
	return out
}

// pause stops deciding parts and waits until their calls in flight are
// answered (their copies acknowledged or failed); resume undoes it.
func (r *Router) pause(ctx context.Context, parts []int) (resume func(), err error) {
	ps := &r.parts
	for _, p := range parts {
		ps.state[p].stopped.Store(true)
	}
	resume = func() {
		for _, p := range parts {
			ps.state[p].stopped.Store(false)
		}
		ps.broadcast()
	}
	for {
		busy := false
		for _, p := range parts {
			if ps.state[p].inflight.Load() > 0 {
				busy = true
			}
		}
		if !busy {
			return resume, nil
		}
		select {
		case <-ctx.Done():
			resume()
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// admitRetry is how long a proposed admission may go unseen before it is
// proposed again.
const admitRetry = 10 * time.Second

// catchUpPause bounds how long a partition is paused to read its keys for
// a follower.
const catchUpPause = 2 * time.Second

// catchUpBatch is the most partitions paused at once to bring a follower
// up to date: their keys are read in one pass over the store.
const catchUpBatch = 8

// catchUpFollowers brings one follower up to date on up to catchUpBatch
// partitions this node leads, and proposes admissions that went unseen.
// The partitions are paused while their keys are read and queued; after
// that every write is copied to the follower too (in order, on the same
// stream), so that once the follower has the states it has every write.
func (r *Router) catchUpFollowers(ctx context.Context, own *ownership) error {
	c := own.cur
	ps := &r.parts
	follower, epoch := "", uint64(0)
	var batch []int
	for _, p := range r.led(own) {
		rec := &c.parts[p]
		for _, id := range rec.Replicas {
			name := c.names[id]
			x := c.members[name]
			if id == rec.Leader || rec.InSync(id) || !c.up(name) || x.ID != id || follower != "" && name != follower {
				continue
			}
			ps.mu.Lock()
			cu := ps.catching[p][name]
			if cu != nil && cu.epoch != x.Epoch {
				delete(ps.catching[p], name)
				cu = nil
			}
			ps.mu.Unlock()
			switch {
			case cu == nil || cu.broken.Load():
				follower, epoch = name, x.Epoch
				batch = append(batch, p)
			case cu.counted.Load() && time.Since(time.Unix(0, cu.proposed.Load())) > admitRetry:
				// Its admission was proposed and this node has not seen it
				// committed: propose it again.
				isr := append(slices.Clone(rec.ISR), control.Incarnation{ID: id, Epoch: x.Epoch})
				if err := r.admitFollower(ctx, control.PartitionChange{P: p, Version: rec.Version, LeaderEpoch: rec.LeaderEpoch, ISR: isr}, name, cu); err != nil {
					return fmt.Errorf("admit %s to partition %d: %w", name, p, err)
				}
			}
		}
		if len(batch) == catchUpBatch {
			break
		}
	}
	if len(batch) == 0 {
		return nil
	}
	err := r.bringUp(ctx, own, batch, follower, epoch)
	kick(ps.kick) // the next batch at once
	return err
}

// bringUp brings follower name (at epoch) up to date on parts and
// proposes its admission to each.
func (r *Router) bringUp(ctx context.Context, own *ownership, parts []int, name string, epoch uint64) error {
	ps := &r.parts
	n := len(own.cur.parts)
	pctx, cancel := context.WithTimeout(ctx, catchUpPause)
	resume, err := r.pause(pctx, parts)
	cancel()
	if err != nil {
		return fmt.Errorf("pause partitions %v: %w", parts, err)
	}
	in := make(map[int]*catchUp, len(parts))
	ps.mu.Lock()
	for _, p := range parts {
		if ps.catching[p] == nil {
			ps.catching[p] = make(map[string]*catchUp)
		}
		in[p] = &catchUp{epoch: epoch}
		ps.catching[p][name] = in[p]
	}
	ps.mu.Unlock()
	start := time.Now()
	var states []persist.Record
	_, err = r.cfg.Engine.Collect(ctx, func(key string) bool {
		return in[shard.Partition(shard.Hash(key), n)] != nil
	}, func(x actor.Exported) error {
		states = append(states, persist.Record{Key: x.Key, Deadline: x.Deadline, Value: x.State})
		return nil
	})
	if err != nil {
		for _, cu := range in {
			cu.broken.Store(true)
		}
		resume()
		return fmt.Errorf("read partitions %v: %w", parts, err)
	}
	wait := r.send(ctx, own, name, states)
	resume()
	paused := time.Since(start)
	if err := wait(ctx); err != nil {
		for _, cu := range in {
			cu.broken.Store(true)
		}
		return fmt.Errorf("copy partitions %v to %s: %w", parts, name, err)
	}
	// Admit: from the proposal on, its answers count (the maximal in-sync
	// set).
	cur := r.own.Load().cur
	x := cur.members[name]
	if x.Epoch != epoch {
		return nil
	}
	var errs []error
	for _, p := range parts {
		rec := cur.parts[p]
		if rec.Leader != cur.members[r.cfg.Self].ID {
			continue
		}
		isr := append(slices.Clone(rec.ISR), control.Incarnation{ID: x.ID, Epoch: epoch})
		ch := control.PartitionChange{P: p, Version: rec.Version, LeaderEpoch: rec.LeaderEpoch, ISR: isr}
		if err := r.admitFollower(ctx, ch, name, in[p]); err != nil {
			errs = append(errs, fmt.Errorf("admit %s to partition %d: %w", name, p, err))
		}
	}
	r.log.Info("brought a follower up to date", "follower", name, "partitions", parts, "keys", len(states), "paused", paused)
	return errors.Join(errs...)
}

// admitFollower proposes ch, which adds the caught-up follower name to a
// partition's in-sync set. Its answers count from the proposal on (I2):
// a write that reaches it before the commit waits for it, and a failed
// one keeps it out. The catch-up goes on until this node applied the map
// that admits it (partsUpdated ends it then): the writes in between reach
// the follower as the catch-up's. A refused proposal ends it at once.
func (r *Router) admitFollower(ctx context.Context, ch control.PartitionChange, name string, cu *catchUp) error {
	ps := &r.parts
	cu.counted.Store(true)
	cu.proposed.Store(time.Now().UnixNano())
	if cu.broken.Load() {
		return errors.New("a write's copy failed")
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := r.ctl().ChangeISR(pctx, []control.PartitionChange{ch})
	switch {
	case errors.Is(err, control.ErrRefused):
		ps.mu.Lock()
		if ps.catching[ch.P][name] == cu {
			delete(ps.catching[ch.P], name)
		}
		ps.mu.Unlock()
	case err == nil && cu.broken.Load():
		// A copy failed while the admission was proposed: take it out
		// again.
		r.shrink([]int{ch.P}, name)
	}
	return err
}

// prefer hands the partitions this node leads to their preferred leaders
// (the first of their replicas) when those are in sync and up: after a
// restart, the cluster's leadership comes back to where the assignment
// spreads it.
func (r *Router) prefer(ctx context.Context, own *ownership) error {
	c := own.cur
	var parts []int
	var changes []control.PartitionChange
	for _, p := range r.led(own) {
		rec := &c.parts[p]
		want := rec.Replicas[0]
		if want == rec.Leader || !rec.InSync(want) || !c.up(c.names[want]) {
			continue
		}
		parts = append(parts, p)
		changes = append(changes, control.PartitionChange{P: p, LeaderEpoch: rec.LeaderEpoch, To: want})
	}
	if len(parts) == 0 {
		return nil
	}
	return r.transfer(ctx, parts, changes)
}

// transfer hands parts to the targets of changes: it stops deciding them,
// waits for their calls in flight, and proposes the transfer. A refused
// transfer changed nothing: the partitions resume. One whose outcome is
// unknown leaves them stopped: this node leads on only through a reclaim
// at the next leader epoch, which commits only if the transfer did not
// (I1).
func (r *Router) transfer(ctx context.Context, parts []int, changes []control.PartitionChange) error {
	pctx, cancel := context.WithTimeout(ctx, catchUpPause)
	resume, err := r.pause(pctx, parts)
	cancel()
	if err != nil {
		return fmt.Errorf("transfer: calls still in flight: %w", err) // nothing proposed; pause resumed them
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = r.ctl().Transfer(tctx, changes)
	cancel()
	switch {
	case err == nil:
		r.log.Info("handed partitions to their preferred leaders", "partitions", len(parts))
		return nil
	case errors.Is(err, control.ErrRefused):
		resume()
		return fmt.Errorf("transfer: %w", err)
	}
	return r.reclaim(ctx, changes, err)
}

// reclaim proposes, until the map says, that this node leads the
// partitions of changes on at the next leader epoch, after a transfer
// that failed with why and may have committed. The partitions stay
// stopped until the map that settles it is applied (partsUpdated).
func (r *Router) reclaim(ctx context.Context, changes []control.PartitionChange, why error) error {
	for i := range changes {
		changes[i].To = ""
	}
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.ctl().Reclaim(rctx, changes)
		cancel()
		if err == nil || errors.Is(err, control.ErrRefused) {
			return fmt.Errorf("transfer: %w", why) // reclaimed, or the transfer committed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("transfer: %v; reclaim: %w", why, err)
		case <-time.After(wait):
		}
	}
}

// Drain stops every partition this node leads, waits for their calls in
// flight, and returns where each goes: the first other live in-sync
// replica, for the entry that ends this node's epoch (control's
// LeaveWith). Partitions with no such replica are not listed: the map
// makes them wait for this node. It returns nothing without partitions.
func (r *Router) Drain(ctx context.Context) []control.PartitionChange {
	own := r.own.Load()
	if own == nil || own.cur.parts == nil {
		return nil
	}
	c := own.cur
	self := c.members[r.cfg.Self]
	var parts []int
	for p := range c.parts {
		if c.parts[p].Leader == self.ID {
			parts = append(parts, p)
		}
	}
	if _, err := r.pause(ctx, parts); err != nil {
		r.log.Warn("drain: calls still in flight", "err", err)
	}
	var out []control.PartitionChange
	for _, p := range parts {
		rec := &c.parts[p]
		for _, id := range rec.Replicas {
			if id != self.ID && rec.InSync(id) && c.up(c.names[id]) {
				out = append(out, control.PartitionChange{P: p, LeaderEpoch: rec.LeaderEpoch, To: id})
				break
			}
		}
	}
	return out
}

// partPenaltyEnd is when the tombstone of key's partition stops denying a
// check of window (zero: it has none). A tombstone marks a partition whose
// every in-sync replica was lost: one window of each key's limit from its
// time, so that the hits the lost replicas allowed and the ones allowed
// after never share a window.
func (c *config) partPenaltyEnd(key string, window time.Duration) time.Time {
	if !c.tombstoned {
		return time.Time{}
	}
	t := c.partOf(key).Tombstone
	if t == 0 {
		return time.Time{}
	}
	return time.Unix(0, t).Add(window)
}
