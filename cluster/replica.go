package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/shard"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file keeps every key's state on its standby too (RouterConfig.Replicas
// 2): the engine hands the router the records of each write (Replicate),
// which go to each key's standby, batched per standby; a handoff round
// brings a standby up to date when it changes (resync) and merges the
// copies this node keeps of the keys it takes over (promote). See
// docs/cluster.md, "Standbys".

// maxReplicateBatch bounds the records of one Replicate call.
const maxReplicateBatch = 2000

// replicaLanes is how many lanes, each a Replicate stream, carry this
// node's copies to one standby. A key always goes through the same lane,
// whose calls are applied in order, so that a key's writes reach the
// standby in the order they were made. One lane: its stream keeps up to
// maxReplicaInflight calls in flight, and four lanes (what unary calls
// needed, so that a write did not wait for a whole call ahead of it) split
// each commit's copies into four calls and four answers, which cost a
// cluster with standbys 1.2-1.3 times the CPU per decision (docs/benchmarks.md,
// "Standbys"). A standby still takes any lane number a sender gives: a
// node of an older version sends on four.
const replicaLanes = 1

// laneOf is the lane of key: with one lane, no hash to compute per copy.
func laneOf(key string) int {
	if replicaLanes == 1 {
		return 0
	}
	return int(shard.Hash(key) % replicaLanes)
}

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
	// closed ends the Replicate streams this node receives: a stream
	// lives until its sender retires it, and a graceful stop would wait
	// that long.
	closed    chan struct{}
	closeOnce sync.Once
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
	p.closed = make(chan struct{})
	// Above any sequence an earlier process of this node used.
	p.seq.Store(uint64(time.Now().UnixNano()))
}

func (p *replication) close() {
	p.closeOnce.Do(func() { close(p.closed) })
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.standbys {
		s.close()
	}
}

// Replicate implements actor.Replicator: it sends each record of a key
// this node acts for to the key's standby and calls done once every
// standby committed its share, or with the first failure. Records of keys
// this node does not act for stay here: deletes of keys it handed over,
// and writes made before the key moved, which its handoff carries (the
// standby's copy belongs to the key's new acting member). Once this
// node's epoch has ended, though, no handoff follows: its keys go on from
// their standbys' copies, so a write it made before the end and copies
// only now fails (its hits stay recorded here, as for any failed copy).
// Records whose key has no standby up (no other member is) are not waited
// for.
func (r *Router) Replicate(recs []persist.Record, done func(error)) {
	if !r.joined() || r.cfg.Replicas < 2 {
		done(nil)
		return
	}
	own := r.own.Load()
	if own.cur.parts != nil {
		r.replicateParts(own, recs, done)
		return
	}
	ended := own.epoch == 0 || own.cur.epochs[r.cfg.Self] != own.epoch
	// A write's keys have few standbys (one per other member at most): a
	// slice searched in order, not a map.
	var (
		partBuf [2 * replicaLanes]replPart
		parts   = partBuf[:0]
	)
	for _, rec := range recs {
		acting, sb := own.cur.copyOf(rec.Key, r.cfg.Self)
		if !acting && ended && rec.Value != nil {
			done(fmt.Errorf("%w: the epoch of %s ended before the copy of %s left; its keys go on from their standbys' copies",
				errStandby, r.cfg.Self, actor.QuoteKey(rec.Key)))
			return
		}
		if sb == "" { // not acting, or no standby up
			continue
		}
		l, p := laneOf(rec.Key), 0
		for p < len(parts) && (parts[p].standby != sb || parts[p].lane != l) {
			p++
		}
		if p == len(parts) {
			parts = append(parts, replPart{standby: sb, lane: l})
		}
		parts[p].recs = append(parts[p].recs, rec)
	}
	if len(parts) == 0 {
		done(nil)
		return
	}
	w := &replWrite{done: done}
	w.left.Store(int32(len(parts)))
	deadline := time.Now().Add(r.cfg.ReplicaTimeout)
	for _, pt := range parts {
		s, err := r.standbySender(own, pt.standby)
		if err != nil {
			w.finish(fmt.Errorf("%w: %s: %v", errStandby, pt.standby, err))
			continue
		}
		s.lanes[pt.lane].enqueue(&replItem{recs: pt.recs, w: w, deadline: deadline, epoch: own.epoch})
	}
}

// replPart is the records of one write for one lane of one standby.
type replPart struct {
	standby string
	lane    int
	recs    []persist.Record
	// With partitions: optional is a follower being brought up to date,
	// whose answer the write does not wait for; parts are the partitions
	// of recs.
	optional bool
	parts    []int
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
	// epoch is this node's epoch the records were written under: the
	// copy carries it (ReplicateRequest.from_epoch), whenever it leaves,
	// so that a standby whose map has ended that epoch refuses it.
	epoch uint64
	// note, if set, learns the item's outcome first; an optional item's
	// outcome goes nowhere else (see replicateParts).
	note     func(error)
	optional bool
}

func (it *replItem) finish(err error) {
	if it.note != nil {
		it.note(err)
	}
	if it.optional {
		return
	}
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

// replicaLane sends the copies of its keys on one Replicate stream: its
// calls leave in sequence, up to maxReplicaInflight of them unanswered, so
// that a key's writes reach the standby in the order they were made and
// none waits for the answer to the call ahead of it.
type replicaLane struct {
	s     *standbySender
	index int
	wake  chan struct{}

	mu    sync.Mutex
	queue []*replItem
	st    *laneStream // nil before the first call, and after a failure
	// retiring is the stream before st, closed for sending (see
	// RouterConfig.ReplicaStreamAge) while its last calls are answered: st sends
	// nothing before, so that the standby applies the lane's calls in
	// order.
	retiring *laneStream
}

// laneStream is one Replicate stream of a lane and its calls not yet
// answered, oldest first (under the lane's mu).
type laneStream struct {
	stream   sluicepb.PeerService_ReplicateClient
	cancel   context.CancelFunc
	inflight []*laneCall
	broken   bool
	opened   time.Time
}

// laneCall is a call sent on a lane's stream and not yet answered.
type laneCall struct {
	seq      uint64
	batch    []*replItem
	n        int // records
	deadline time.Time
	// sending is held while Send encodes the call: its records point into
	// the engine's buffers, which finishing an item hands back for reuse,
	// so an item is finished (failed by a deadline or a broken stream, or
	// answered) only once Send has returned.
	sending sync.WaitGroup
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
			st, rt := l.st, l.retiring
			l.mu.Unlock()
			err := fmt.Errorf("%w: %s: sender closed", errStandby, l.s.name)
			for _, x := range []*laneStream{st, rt} {
				if x != nil {
					l.broke(x, err)
				}
			}
			for _, it := range left {
				it.finish(err)
			}
			return
		case <-l.wake:
		}
		for l.sendBatch() {
		}
	}
}

// sendBatch sends one batch of what is queued, and reports whether more
// is queued and may be sent now (not when maxReplicaInflight calls wait
// for their answers: an answer wakes the lane).
func (l *replicaLane) sendBatch() bool {
	s := l.s
	now := time.Now()
	l.mu.Lock()
	if r := l.retiring; r != nil {
		if len(r.inflight) > 0 && !r.broken {
			l.mu.Unlock()
			return false // its answers wake the lane
		}
		l.retiring = nil
	}
	if st := l.st; st != nil && now.Sub(st.opened) > s.r.cfg.ReplicaStreamAge {
		// Retire it: no more calls on it; the next one opens a new stream
		// once its calls in flight are answered (its answers end in EOF).
		l.st, l.retiring = nil, st
		l.mu.Unlock()
		st.stream.CloseSend()
		return true
	}
	if l.st != nil && len(l.st.inflight) >= maxReplicaInflight {
		l.mu.Unlock()
		return false
	}
	// A call carries the copies of one epoch of this node: an item written
	// under another than the batch's first waits for the next call.
	var batch []*replItem
	n, deadline := 0, time.Time{}
	for len(l.queue) > 0 && (len(batch) == 0 || n+len(l.queue[0].recs) <= maxReplicateBatch && l.queue[0].epoch == batch[0].epoch) {
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
	req := &sluicepb.ReplicateRequest{FromNode: s.r.cfg.Self, FromEpoch: batch[0].epoch, ToNode: s.name, ToEpoch: s.epoch,
		MapVersion: s.r.mapVersion(), Lane: uint32(l.index), Sequence: s.r.repl.seq.Add(1),
		Records: make([]*sluicepb.StoreRecord, 0, n)}
	for _, it := range batch {
		for _, rec := range it.recs {
			req.Records = append(req.Records, &sluicepb.StoreRecord{Key: []byte(rec.Key), Deadline: rec.Deadline, Value: rec.Value, Append: rec.Append})
		}
	}
	call := &laneCall{seq: req.Sequence, batch: batch, n: n, deadline: deadline}
	for attempt := 0; ; attempt++ {
		st, err := l.stream()
		if err == nil {
			l.mu.Lock()
			broken := st.broken
			if !broken {
				call.sending.Add(1)
				st.inflight = append(st.inflight, call)
			}
			l.mu.Unlock()
			if broken { // it failed since: nothing of this call was sent
				err = errors.New("stream ended")
			} else {
				err := st.stream.Send(req)
				call.sending.Done()
				if err != nil {
					l.broke(st, err) // fails the call, now in flight
				}
				return more
			}
		}
		if attempt == 1 {
			s.r.cfg.Observer.Replicated(s.name, n, err)
			err = fmt.Errorf("%w: %s: %v", errStandby, s.name, err)
			for _, it := range batch {
				it.finish(err)
			}
			return more
		}
	}
}

// stream returns the lane's stream, opened if it has none, with the
// goroutines that read its answers and watch its deadlines.
func (l *replicaLane) stream() (*laneStream, error) {
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	if st != nil {
		return st, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := l.s.p.client.Replicate(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	st = &laneStream{stream: stream, cancel: cancel, opened: time.Now()}
	l.mu.Lock()
	l.st = st
	l.mu.Unlock()
	r := l.s.r
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		l.answers(st)
	}()
	go func() {
		defer r.wg.Done()
		l.watch(ctx, st)
	}()
	return st, nil
}

// answers reads st's answers, each the oldest call in flight's, until the
// stream fails.
func (l *replicaLane) answers(st *laneStream) {
	s := l.s
	for {
		resp, err := st.stream.Recv()
		if err != nil {
			l.broke(st, err)
			return
		}
		l.mu.Lock()
		var call *laneCall
		if !st.broken && len(st.inflight) > 0 && st.inflight[0].seq == resp.Sequence {
			call = st.inflight[0]
			st.inflight = st.inflight[1:]
		}
		l.mu.Unlock()
		if call == nil {
			l.broke(st, fmt.Errorf("answer to call %d, which is not the oldest in flight", resp.Sequence))
			return
		}
		kick(l.wake)
		call.sending.Wait()
		if resp.Code != 0 {
			// Refused, nothing of it applied: its copies are in doubt
			// (the calls after it were applied without them).
			s.r.unsync(s.name)
			err := fmt.Errorf("%w: %s: %v", errStandby, s.name, status.Error(codes.Code(resp.Code), resp.Message))
			s.r.cfg.Observer.Replicated(s.name, call.n, err)
			for _, it := range call.batch {
				it.finish(err)
			}
			continue
		}
		s.r.cfg.Observer.Replicated(s.name, call.n, nil)
		if len(resp.Missing) == 0 {
			for _, it := range call.batch {
				it.finish(nil)
			}
			continue
		}
		// The standby lost a copy this node counted on: bring it up to
		// date again before anything depends on it.
		missing := make(map[string]bool, len(resp.Missing))
		for _, k := range resp.Missing {
			missing[string(k)] = true
		}
		s.r.unsync(s.name)
		for _, it := range call.batch {
			var bad error
			for _, rec := range it.recs {
				if missing[rec.Key] {
					bad = fmt.Errorf("%w: %s lost its copy of %s; bringing it up to date", errStandby, s.name, actor.QuoteKey(rec.Key))
					break
				}
			}
			it.finish(bad)
		}
	}
}

// watch ends st when its oldest call in flight is past its deadline, until
// st ends.
func (l *replicaLane) watch(ctx context.Context, st *laneStream) {
	tick := time.NewTicker(max(time.Millisecond, min(20*time.Millisecond, l.s.r.cfg.ReplicaTimeout/10)))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			l.mu.Lock()
			var late uint64
			if len(st.inflight) > 0 && now.After(st.inflight[0].deadline) {
				late = st.inflight[0].seq
			}
			l.mu.Unlock()
			if late != 0 {
				l.broke(st, fmt.Errorf("call %d not answered within the replica timeout", late))
				return
			}
		}
	}
}

// broke ends st after err, once: its calls not yet answered fail. The
// standby may still apply them, after a later stream's: its copies are in
// doubt until it is brought up to date again. The next call opens a new
// stream.
func (l *replicaLane) broke(st *laneStream, err error) {
	s := l.s
	l.mu.Lock()
	if st.broken {
		l.mu.Unlock()
		return
	}
	st.broken = true
	if l.st == st {
		l.st = nil
	}
	calls := st.inflight
	st.inflight = nil
	l.mu.Unlock()
	st.cancel()
	if len(calls) == 0 {
		return
	}
	s.r.unsync(s.name)
	err = fmt.Errorf("%w: %s: %v", errStandby, s.name, err)
	for _, call := range calls {
		call.sending.Wait() // st.cancel() above ends a Send that blocks
		s.r.cfg.Observer.Replicated(s.name, call.n, err)
		for _, it := range call.batch {
			it.finish(err)
		}
	}
	kick(l.wake)
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
			s.lanes[l].enqueue(&replItem{recs: part, deadline: deadline, result: result, epoch: own.epoch})
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

// receiveReplicas applies one Replicate stream: each call is checked and
// submitted to the store as it arrives, in order, and answered, in the
// same order, once it is committed (or with the status that refused it),
// so that several calls of the lane are in flight at once. The stream
// ends when either side fails to send or receive.
func (r *Router) receiveReplicas(stream sluicepb.PeerService_ReplicateServer) error {
	ctx := stream.Context()
	if !r.joined() {
		return fmt.Errorf("%w: this node is not in a cluster", errWrongEpoch)
	}
	// Calls arrive on reqs (or the stream's end on ended); acks carries
	// the submitted ones to the goroutine that answers them, in order, the
	// only one that sends on the stream, and that says on failed why it
	// stopped answering.
	done := make(chan struct{})
	defer close(done)
	reqs, ended := make(chan *sluicepb.ReplicateRequest), make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case reqs <- req:
			case <-done:
				return
			}
		}
	}()
	acks, failed, answered := make(chan *replicaAck, maxReplicaInflight), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(answered)
		var err error
		for a := range acks {
			werr := a.err
			if a.w != nil {
				werr = a.w.Wait(context.Background()) // the commit, even if the stream ended: then release
				a.release()
			}
			if err != nil {
				continue // answering stopped: let the rest commit
			}
			resp := &sluicepb.ReplicateResponse{Sequence: a.seq}
			var mb *actor.MissingBaseError
			switch {
			case errors.As(werr, &mb):
				for _, k := range mb.Keys {
					resp.Missing = append(resp.Missing, []byte(k))
				}
			case werr != nil:
				st := status.Convert(Status(werr))
				resp.Code, resp.Message = uint32(st.Code()), st.Message()
			}
			if err = stream.Send(resp); err != nil {
				failed <- err
			}
		}
	}()
	var err error
loop:
	for {
		select {
		case req := <-reqs:
			a, serr := r.submitReplicas(ctx, req)
			if serr != nil {
				a = &replicaAck{seq: req.Sequence, err: serr}
			}
			acks <- a
		case err = <-ended:
			if errors.Is(err, io.EOF) {
				err = nil
			}
			break loop
		case err = <-failed:
			break loop
		case <-r.repl.closed:
			// The calls received so far are answered; the sender sends
			// the rest elsewhere, as for any broken stream.
			err = fmt.Errorf("cluster: this standby is stopping: %w", actor.ErrClosed)
			break loop
		}
	}
	close(acks)
	<-answered
	if err == nil && len(failed) > 0 {
		err = <-failed
	}
	return err
}

// maxReplicaInflight bounds the calls of one lane in flight, on both
// sides.
const maxReplicaInflight = 16

// replicaAck is a call of a Replicate stream submitted to the store (its
// answer waits for w, then release lets the ownership change again), or
// refused with err.
type replicaAck struct {
	seq     uint64
	w       *actor.ReplicaWrite
	release func()
	err     error
}

// submitReplicas checks one call of a Replicate stream and submits its
// copies. It first applies at least the map version the sender acted
// under, then refuses a sender whose epoch its map has ended (a standby
// that applied the end of an owner's epoch takes no late write from it
// before it takes its keys over), copies meant for another epoch of this
// node, and a call older than one already applied on its lane (a late
// retry: a copy never goes back). Until the copies are committed (the
// ack's release), no change of ownership is published: promote merges
// every copy written under the older one.
func (r *Router) submitReplicas(ctx context.Context, req *sluicepb.ReplicateRequest) (*replicaAck, error) {
	if err := r.catchUp(ctx, req.MapVersion); err != nil {
		return nil, err
	}
	r.copies.RLock()
	own := r.own.Load()
	switch {
	case req.ToNode != r.cfg.Self || req.ToEpoch != own.epoch:
		r.copies.RUnlock()
		return nil, fmt.Errorf("%w: meant for %s epoch %d; this is %s epoch %d", errWrongEpoch, req.ToNode, req.ToEpoch, r.cfg.Self, own.epoch)
	case own.cur.epochs[req.FromNode] != req.FromEpoch:
		r.copies.RUnlock()
		return nil, fmt.Errorf("%w: %s epoch %d is not live in %s's map (version %d)", errWrongEpoch, req.FromNode, req.FromEpoch, r.cfg.Self, own.cur.m.Version)
	}
	lane := r.repl.lane(laneKey{req.FromNode, req.FromEpoch, req.Lane})
	lane.mu.Lock()
	defer lane.mu.Unlock()
	if req.Sequence <= lane.last {
		r.copies.RUnlock()
		return nil, fmt.Errorf("%w: call %d of lane %d from %s arrived after call %d", errLate, req.Sequence, req.Lane, req.FromNode, lane.last)
	}
	recs := make([]persist.Record, len(req.Records))
	for i, pr := range req.Records {
		recs[i] = persist.Record{Key: string(pr.Key), Deadline: pr.Deadline, Value: pr.Value, Append: pr.Append}
	}
	submit := r.cfg.Engine.SubmitReplicas
	if own.cur.parts != nil {
		// Partitions: a follower's copies are its keys (see partitions.go).
		if err := r.checkFollower(own, req.FromNode, recs); err != nil {
			r.copies.RUnlock()
			return nil, err
		}
		submit = r.cfg.Engine.SubmitFollower
	}
	w, err := submit(ctx, recs)
	if err != nil {
		r.copies.RUnlock()
		return nil, err
	}
	lane.last = req.Sequence
	return &replicaAck{seq: req.Sequence, w: w, release: r.copies.RUnlock}, nil
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
