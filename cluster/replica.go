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

// Replicate implements actor.Replicator: it sends each record of a key
// this node acts for to the key's standby and calls done once every
// standby committed its share, or with the first failure. Records of keys
// this node does not act for (the deletes of keys it handed over) stay
// here: the standby's copy belongs to the key's new acting member. Records
// whose key has no standby up (no other member is) are not waited for.
func (r *Router) Replicate(recs []persist.Record, done func(error)) {
	if r.cfg.Membership == nil || r.cfg.Replicas < 2 {
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
	inc   uint64 // the standby's incarnation the copies are for
	p     *peer
	lanes [replicaLanes]*replicaLane
	quit  chan struct{}
	once  sync.Once
}

// replicaLane sends the copies of its keys one call at a time, so that a
// key's writes reach the standby in the order they were made.
type replicaLane struct {
	s     *standbySender
	mu    sync.Mutex
	queue []*replItem
	wake  chan struct{}
}

// standbySender returns the sender to the live member name, for its
// current incarnation.
func (r *Router) standbySender(own *ownership, name string) (*standbySender, error) {
	m, ok := own.cur.live[name]
	if !ok {
		return nil, fmt.Errorf("%s is not a live member", name)
	}
	p, err := r.peer(name)
	if err != nil {
		return nil, err
	}
	r.replMu.Lock()
	defer r.replMu.Unlock()
	if s := r.standbys[name]; s != nil && s.inc == m.Incarnation && s.p == p {
		return s, nil
	} else if s != nil {
		s.close()
	}
	s := &standbySender{r: r, name: name, inc: m.Incarnation, p: p, quit: make(chan struct{})}
	for i := range s.lanes {
		l := &replicaLane{s: s, wake: make(chan struct{}, 1)}
		s.lanes[i] = l
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			l.run()
		}()
	}
	r.standbys[name] = s
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
	req := &sluicepb.ReplicateRequest{FromNode: s.r.cfg.Self, FromIncarnation: own.inc, ToNode: s.name, ToIncarnation: s.inc,
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

// sendAndWait sends recs to standby name through its lanes (each key
// after what is queued for it) and waits for the standby's answers.
func (r *Router) sendAndWait(ctx context.Context, own *ownership, name string, recs []persist.Record) error {
	s, err := r.standbySender(own, name)
	if err != nil {
		return err
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

// replicateStates sends full states to the standbys of their keys and
// waits until each committed them: keys that arrived by handoff, or that
// this node took over, are on two nodes before anything depends on them.
func (r *Router) replicateStates(ctx context.Context, own *ownership, states []actor.Exported) error {
	if r.cfg.Replicas < 2 || len(states) == 0 {
		return nil
	}
	bySb := make(map[string][]persist.Record)
	for _, x := range states {
		if sb := own.cur.standby(x.Key); sb != "" {
			bySb[sb] = append(bySb[sb], persist.Record{Key: x.Key, Deadline: x.Deadline, Value: x.State})
		}
	}
	var errs []error
	for sb, recs := range bySb {
		if err := r.sendAndWait(ctx, own, sb, recs); err != nil {
			errs = append(errs, fmt.Errorf("replicate to %s: %w", sb, err))
		}
	}
	return errors.Join(errs...)
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
		return o.amended(r.clk.Now(), func(n *ownership) {
			n.synced = cloneMap(o.synced)
			delete(n.synced, name)
		})
	})
	if changed {
		r.cfg.Engine.Fence()
		kick(r.handoffKick)
	}
}

// receiveReplicas stores copies another node sends as the standby of its
// keys.
func (r *Router) receiveReplicas(ctx context.Context, req *sluicepb.ReplicateRequest) (*sluicepb.ReplicateResponse, error) {
	own := r.own.Load()
	if req.ToNode != r.cfg.Self || req.ToIncarnation != own.inc {
		return nil, fmt.Errorf("%w: meant for %s incarnation %d; this is %s incarnation %d", errWrongIncarnation, req.ToNode, req.ToIncarnation, r.cfg.Self, own.inc)
	}
	recs := make([]persist.Record, len(req.Records))
	for i, pr := range req.Records {
		recs[i] = persist.Record{Key: string(pr.Key), Deadline: pr.Deadline, Value: pr.Value, Append: pr.Append}
	}
	err := r.cfg.Engine.PutReplicas(ctx, recs)
	var mb *actor.MissingBaseError
	if errors.As(err, &mb) {
		resp := &sluicepb.ReplicateResponse{}
		for _, k := range mb.Keys {
			resp.Missing = append(resp.Missing, []byte(k))
		}
		return resp, nil
	}
	if err != nil {
		return nil, err
	}
	return &sluicepb.ReplicateResponse{}, nil
}
