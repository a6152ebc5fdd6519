package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/shard"
)

// This file keeps every key's state on its standby too (RouterConfig.Replicas
// 2): the engine hands the router the records of each write (Replicate),
// which go to each key's standby, batched per standby; a handoff round
// brings a standby up to date when it changes (resync) and merges the
// copies this node keeps of the keys it takes over (promote). See
// docs/cluster.md, "Standbys".

// maxReplicateBatch bounds the records of one Replicate call.
const maxReplicateBatch = 2000

// replicaLanes is how many Replicate calls may be in flight to one standby.
// A key always goes through the same lane, whose calls leave one at a
// time, so that a key's writes reach the standby in the order they were
// made; several lanes keep a write from waiting for a whole call in flight
// before its own leaves.
const replicaLanes = 4

// laneOf is the lane of key.
func laneOf(key string) int { return int(shard.Hash(key) % replicaLanes) }

// errStandby is a write its standby did not confirm.
var errStandby = errors.New("cluster: standby did not confirm")

// replication is the sending and receiving side of standby copies. Its
// lock is taken after the router's ownMu, imports and copies, and the
// handoffs' lock, never before.
type replication struct {
	r   *Router
	seq atomic.Uint64 // sequence of this node's Replicate calls, all lanes

	mu       sync.Mutex
	standbys map[string]*standbySender // by name
	lanes    map[laneKey]*laneIn       // receiving side
}

// laneKey names one lane of one sender epoch, on the receiving side.
type laneKey struct {
	from  string
	epoch uint64
	lane  uint32
}

// laneIn is a receiving lane: the last sequence applied, and a lock held
// while a call of the lane is applied.
type laneIn struct {
	mu   sync.Mutex
	last uint64
}

func (p *replication) init(r *Router) {
	p.r = r
	p.standbys = make(map[string]*standbySender)
	p.lanes = make(map[laneKey]*laneIn)
	// Above any sequence an earlier process of this node used.
	p.seq.Store(uint64(time.Now().UnixNano()))
}

func (p *replication) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.standbys {
		s.close()
	}
}

// Replicate implements actor.Replicator: it sends each record of a key
// this node acts for to the key's standby and calls done once every
// standby committed its share, or with the first failure. Records of keys
// this node does not act for (the deletes of keys it handed over) stay
// here: the standby's copy belongs to the key's new acting member. Records
// whose key has no standby up (no other member is) are not waited for.
func (r *Router) Replicate(recs []persist.Record, done func(error)) {
	if r.ctl == nil || r.cfg.Replicas < 2 {
		done(nil)
		return
	}
	own := r.own.Load()
	var byStandby map[string]*[replicaLanes][]persist.Record
	parts := 0
	for _, rec := range recs {
		if own.cur.actingName(rec.Key) != r.cfg.Self {
			continue
		}
		sb := own.cur.standbyAfter(rec.Key, r.cfg.Self)
		if sb == "" {
			continue
		}
		if byStandby == nil {
			byStandby = make(map[string]*[replicaLanes][]persist.Record, 2)
		}
		lanes := byStandby[sb]
		if lanes == nil {
			lanes = new([replicaLanes][]persist.Record)
			byStandby[sb] = lanes
		}
		l := laneOf(rec.Key)
		if len(lanes[l]) == 0 {
			parts++
		}
		lanes[l] = append(lanes[l], rec)
	}
	if parts == 0 {
		done(nil)
		return
	}
	w := &replWrite{done: done}
	w.left.Store(int32(parts))
	deadline := time.Now().Add(r.cfg.ReplicaTimeout)
	for sb, lanes := range byStandby {
		s, err := r.standbySender(own, sb)
		for l, rs := range lanes {
			switch {
			case len(rs) == 0:
			case err != nil:
				w.finish(fmt.Errorf("%w: %s: %v", errStandby, sb, err))
			default:
				s.lanes[l].enqueue(&replItem{recs: rs, w: w, deadline: deadline})
			}
		}
	}
}

// replWrite is one write of the engine waiting for its standbys.
type replWrite struct {
	done func(error)
	left atomic.Int32
	err  atomic.Pointer[error]
}

// finish records one standby's answer; the last calls done.
func (w *replWrite) finish(err error) {
	if err != nil {
		w.err.CompareAndSwap(nil, &err)
	}
	if w.left.Add(-1) == 0 {
		if p := w.err.Load(); p != nil {
			w.done(*p)
			return
		}
		w.done(nil)
	}
}

// replItem is one write's records for one standby. The records point into
// the engine's buffers: they are read only until finish is called.
type replItem struct {
	recs     []persist.Record
	w        *replWrite
	deadline time.Time
	result   chan error // instead of w, for the router's own waits
}

func (it *replItem) finish(err error) {
	if it.result != nil {
		it.result <- err
		return
	}
	it.w.finish(err)
}

// standbySender sends one standby its copies, through replicaLanes lanes.
type standbySender struct {
	r     *Router
	name  string
	epoch uint64 // the standby's epoch the copies are for
	p     *peer
	lanes [replicaLanes]*replicaLane
	quit  chan struct{}
	once  sync.Once
}

// replicaLane sends the copies of its keys one call at a time, so that a
// key's writes reach the standby in the order they were made.
type replicaLane struct {
	s     *standbySender
	index int
	mu    sync.Mutex
	queue []*replItem
	wake  chan struct{}
}

// standbySender returns the sender to the live member name, for its
// current epoch.
func (r *Router) standbySender(own *ownership, name string) (*standbySender, error) {
	epoch, ok := own.cur.epochs[name]
	if !ok {
		return nil, fmt.Errorf("%s is not a live member", name)
	}
	p, err := r.peers.get(name)
	if err != nil {
		return nil, err
	}
	r.repl.mu.Lock()
	defer r.repl.mu.Unlock()
	if s := r.repl.standbys[name]; s != nil && s.epoch == epoch && s.p == p {
		return s, nil
	} else if s != nil {
		s.close()
	}
	s := &standbySender{r: r, name: name, epoch: epoch, p: p, quit: make(chan struct{})}
	for i := range s.lanes {
		l := &replicaLane{s: s, index: i, wake: make(chan struct{}, 1)}
		s.lanes[i] = l
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			l.run()
		}()
	}
	r.repl.standbys[name] = s
	return s, nil
}

func (l *replicaLane) enqueue(it *replItem) {
	s := l.s
	l.mu.Lock()
	select {
	case <-s.quit:
		l.mu.Unlock()
		it.finish(fmt.Errorf("%w: %s: sender closed", errStandby, s.name))
		return
	default:
	}
	l.queue = append(l.queue, it)
	l.mu.Unlock()
	kick(l.wake)
}

func (s *standbySender) close() { s.once.Do(func() { close(s.quit) }) }

// run sends what is queued, a batch per call, until closed; then fails
// what is left.
func (l *replicaLane) run() {
	for {
		select {
		case <-l.s.quit:
			l.mu.Lock()
			left := l.queue
			l.queue = nil
			l.mu.Unlock()
			for _, it := range left {
				it.finish(fmt.Errorf("%w: %s: sender closed", errStandby, l.s.name))
			}
			return
		case <-l.wake:
		}
		for l.sendBatch() {
		}
	}
}

// sendBatch sends one batch of what is queued, and reports whether more
// is queued.
func (l *replicaLane) sendBatch() bool {
	s := l.s
	now := time.Now()
	l.mu.Lock()
	var batch []*replItem
	n, deadline := 0, time.Time{}
	for len(l.queue) > 0 && (n == 0 || n+len(l.queue[0].recs) <= maxReplicateBatch) {
		it := l.queue[0]
		l.queue = l.queue[1:]
		if now.After(it.deadline) {
			l.mu.Unlock()
			it.finish(fmt.Errorf("%w: %s: not sent within the replica timeout", errStandby, s.name))
			l.mu.Lock()
			continue
		}
		batch = append(batch, it)
		n += len(it.recs)
		if deadline.IsZero() || it.deadline.Before(deadline) {
			deadline = it.deadline
		}
	}
	more := len(l.queue) > 0
	l.mu.Unlock()
	if len(batch) == 0 {
		return more
	}
	own := s.r.own.Load()
	req := &sluicepb.ReplicateRequest{FromNode: s.r.cfg.Self, FromEpoch: own.epoch, ToNode: s.name, ToEpoch: s.epoch,
		MapVersion: s.r.mapVersion(), Lane: uint32(l.index), Sequence: s.r.repl.seq.Add(1),
		Records: make([]*sluicepb.StoreRecord, 0, n)}
	for _, it := range batch {
		for _, rec := range it.recs {
			req.Records = append(req.Records, &sluicepb.StoreRecord{Key: []byte(rec.Key), Deadline: rec.Deadline, Value: rec.Value, Append: rec.Append})
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	resp, err := s.p.client.Replicate(ctx, req)
	cancel()
	s.r.cfg.Observer.Replicated(s.name, n, err)
	if err != nil {
		// The standby may still apply this call, after later ones of the
		// lane (a timeout): its copies are in doubt until it is brought up
		// to date again.
		s.r.unsync(s.name)
		err = fmt.Errorf("%w: %s: %v", errStandby, s.name, err)
		for _, it := range batch {
			it.finish(err)
		}
		return more
	}
	if len(resp.Missing) > 0 {
		// The standby lost a copy this node counted on: bring it up to
		// date again before anything depends on it.
		missing := make(map[string]bool, len(resp.Missing))
		for _, k := range resp.Missing {
			missing[string(k)] = true
		}
		s.r.unsync(s.name)
		for _, it := range batch {
			var bad error
			for _, rec := range it.recs {
				if missing[rec.Key] {
					bad = fmt.Errorf("%w: %s lost its copy of %s; bringing it up to date", errStandby, s.name, actor.QuoteKey(rec.Key))
					break
				}
			}
			it.finish(bad)
		}
		return more
	}
	for _, it := range batch {
		it.finish(nil)
	}
	return more
}

// send queues recs for standby name through its lanes (each key after what
// is queued for it) and returns a function that waits for the standby's
// answers. What is queued keeps its place: a state read before a later
// write of its key must be queued before that write's copy, or it would
// roll the copy back (see handoffRound).
func (r *Router) send(ctx context.Context, own *ownership, name string, recs []persist.Record) func(context.Context) error {
	s, err := r.standbySender(own, name)
	if err != nil {
		return func(context.Context) error { return err }
	}
	var lanes [replicaLanes][]persist.Record
	for _, rec := range recs {
		l := laneOf(rec.Key)
		lanes[l] = append(lanes[l], rec)
	}
	deadline := time.Now().Add(r.cfg.HandoffTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	result := make(chan error, len(recs)/maxReplicateBatch+replicaLanes)
	sent := 0
	for l, rs := range lanes {
		for start := 0; start < len(rs); start += maxReplicateBatch {
			part := rs[start:min(start+maxReplicateBatch, len(rs))]
			s.lanes[l].enqueue(&replItem{recs: part, deadline: deadline, result: result})
			sent++
		}
	}
	return func(ctx context.Context) error {
		var errs []error
		for range sent {
			select {
			case err := <-result:
				if err != nil {
					errs = append(errs, err)
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return errors.Join(errs...)
	}
}

// unsync marks standby name as no longer up to date: keys it keeps wait
// until a round brings it up to date again, and calls routed before are
// checked again in the actors. A standby already marked so changes
// nothing: a kick would cancel the round under way.
func (r *Router) unsync(name string) {
	changed := false
	r.amend(func(o *ownership) *ownership {
		if _, ok := o.synced[name]; !ok {
			return o
		}
		changed = true
		return o.amended(func(n *ownership) {
			n.synced = cloneMap(o.synced)
			delete(n.synced, name)
		})
	})
	if changed {
		r.cfg.Engine.Fence()
		kick(r.handoffs.kick)
	}
}

// receiveReplicas stores copies another node sends as the standby of its
// keys. It first applies at least the map version the sender acted under,
// then refuses a sender whose epoch its map has ended (a standby that
// applied the end of an owner's epoch takes no late write from it before
// it takes its keys over), copies meant for another epoch of this node,
// and a call older than one already applied on its lane (a late retry:
// a copy never goes back).
func (r *Router) receiveReplicas(ctx context.Context, req *sluicepb.ReplicateRequest) (*sluicepb.ReplicateResponse, error) {
	if r.ctl == nil {
		return nil, fmt.Errorf("%w: this node is not in a cluster", errWrongEpoch)
	}
	if err := r.catchUp(ctx, req.MapVersion); err != nil {
		return nil, err
	}
	r.copies.RLock()
	defer r.copies.RUnlock()
	own := r.own.Load()
	switch {
	case req.ToNode != r.cfg.Self || req.ToEpoch != own.epoch:
		return nil, fmt.Errorf("%w: meant for %s epoch %d; this is %s epoch %d", errWrongEpoch, req.ToNode, req.ToEpoch, r.cfg.Self, own.epoch)
	case own.cur.epochs[req.FromNode] != req.FromEpoch:
		return nil, fmt.Errorf("%w: %s epoch %d is not live in %s's map (version %d)", errWrongEpoch, req.FromNode, req.FromEpoch, r.cfg.Self, own.cur.m.Version)
	}
	lane := r.repl.lane(laneKey{req.FromNode, req.FromEpoch, req.Lane})
	lane.mu.Lock()
	defer lane.mu.Unlock()
	if req.Sequence <= lane.last {
		return nil, fmt.Errorf("%w: call %d of lane %d from %s arrived after call %d", errLate, req.Sequence, req.Lane, req.FromNode, lane.last)
	}
	recs := make([]persist.Record, len(req.Records))
	for i, pr := range req.Records {
		recs[i] = persist.Record{Key: string(pr.Key), Deadline: pr.Deadline, Value: pr.Value, Append: pr.Append}
	}
	err := r.cfg.Engine.PutReplicas(ctx, recs)
	var mb *actor.MissingBaseError
	if err != nil && !errors.As(err, &mb) {
		return nil, err
	}
	lane.last = req.Sequence
	resp := &sluicepb.ReplicateResponse{}
	if mb != nil {
		for _, k := range mb.Keys {
			resp.Missing = append(resp.Missing, []byte(k))
		}
	}
	return resp, nil
}

// errLate is a standby write that arrived after a later one of its lane.
var errLate = errors.New("cluster: late copy")

// lane returns the receiving lane k, made on first use.
func (p *replication) lane(k laneKey) *laneIn {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.lanes[k]
	if l == nil {
		l = &laneIn{}
		p.lanes[k] = l
	}
	return l
}
