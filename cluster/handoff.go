package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice/actor"
	"github.com/sluice-io/sluice/cluster/control"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// handoffChunk is how many keys one Handoff call carries.
const handoffChunk = 500

// Backoff of handoff rounds that could not deliver everything.
const (
	handoffBackoffMin = 200 * time.Millisecond
	handoffBackoffMax = time.Second
)

// handoffs is what the handoff rounds remember. Its lock is taken after
// the router's ownMu and imports, never before.
type handoffs struct {
	kick chan struct{} // capacity 1: wakes the handoff loop

	mu        sync.Mutex
	handedTo  map[string]handedTo // last complete sent to each member
	scanned   handoffScan         // the last round that delivered all it collected
	lastRound *config             // the configuration of that round
	idle      chan struct{}       // closed when a round left nothing to send
	reported  syncReport          // the last synced mark written to the map
}

// handedTo records a complete sent: to which epoch, for which
// configuration.
type handedTo struct {
	epoch, config, seq uint64
}

// syncReport is a synced mark this node wrote to the map.
type syncReport struct {
	epoch, config uint64
}

// handoffScan describes the last round that delivered everything it
// collected: for which configuration and epoch, and whether it kept keys
// nobody could decide.
type handoffScan struct {
	config, epoch uint64
	orphans       bool
}

func (h *handoffs) init() {
	h.kick = make(chan struct{}, 1)
	h.handedTo = make(map[string]handedTo)
	h.idle = make(chan struct{})
}

// rescan makes the next round collect again: what this node holds may
// belong elsewhere now.
func (h *handoffs) rescan() {
	h.mu.Lock()
	h.scanned = handoffScan{}
	h.mu.Unlock()
}

// handoffLoop moves key state to where it belongs until ctx ends: on every
// change of ownership (and whenever state for keys this node does not act
// for arrived) it runs a round; a round that could not deliver everything
// is run again with backoff. A newer change cancels the round in flight:
// nothing is lost, since a key is forgotten here only once its receiver
// committed it.
func (r *Router) handoffLoop(ctx context.Context) {
	backoff := handoffBackoffMin
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.handoffs.kick:
		case <-retry:
		}
		retry = nil
		rctx, cancel := context.WithCancel(ctx)
		type result struct {
			sent int
			err  error
		}
		done := make(chan result, 1)
		go func() {
			sent, err := r.handoffRound(rctx)
			done <- result{sent, err}
		}()
		var res result
		select {
		case res = <-done:
			cancel()
		case <-r.handoffs.kick:
			cancel()
			<-done
			kick(r.handoffs.kick) // a new round at once, for the newer ownership
			continue
		case <-ctx.Done():
			cancel()
			<-done
			return
		}
		if res.err == nil {
			backoff = handoffBackoffMin
			if res.sent > 0 {
				kick(r.handoffs.kick) // make sure nothing was left behind
			}
			continue
		}
		if ctx.Err() == nil {
			r.log.Warn("handoff incomplete; retrying", "err", res.err, "retry_in", backoff)
		}
		retry = time.After(time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())))
		backoff = min(2*backoff, handoffBackoffMax)
	}
}

// handoffRound sends every key this node holds but does not act for to
// the member that acts for it, forgets each once delivered, and then tells
// every live member it has nothing more for it in this configuration. Keys
// nobody may decide now stay here. With standbys it also merges the copies
// of keys this node took over into them, and brings each standby of its
// keys up to date. Once a round did all of it, this node writes its synced
// mark to the map (see control.Member.Synced). It returns how many keys it
// delivered, and nil once every member got its keys and its complete.
func (r *Router) handoffRound(ctx context.Context) (int, error) {
	// Imports admitted under an older ownership finish before the keys are
	// collected, so that what they brought is collected too; later ones
	// are checked against this ownership.
	r.imports.Lock()
	own := r.own.Load()
	r.imports.Unlock()
	cur := own.cur
	r.ownMu.Lock()
	seq := r.applied.seq
	version := r.applied.version
	r.ownMu.Unlock()
	self := r.cfg.Self
	standbys := cur.replicas >= 2
	if own.epoch == 0 || cur.parts != nil {
		// No epoch: nobody would take what this node sends. Partitions:
		// no key moves (see partitions.go).
		return 0, nil
	}
	h := &r.handoffs

	// From here until every standby's full states are queued, no handoff
	// import runs: a state collected before an import of its key, and
	// queued after the import's copy, would roll the standby's copy back
	// past it. (Decisions on those keys wait: their standby is not up to
	// date; the engine's fence keeps out the ones routed before.)
	r.resyncs.Lock()
	locked := true
	defer func() {
		if locked {
			r.resyncs.Unlock()
		}
	}()

	// With standbys: merge the copies this node keeps of the keys it now
	// acts for (it took them over) into them.
	promoted := false
	if standbys && own.promoted != cur.id {
		if err := r.promote(ctx, own); err != nil {
			return 0, fmt.Errorf("take over the copies kept here: %w", err)
		}
		promoted = true
	}

	// What goes to each member: the keys it acts for and this node holds
	// (tokens, forgotten here once delivered), the copies this node keeps
	// of keys it gained or of a member that came back (kept here), and, as
	// their standby, the full state of the keys this node acts for.
	out := make(map[string]*outbox)
	box := func(name string) *outbox {
		if out[name] == nil {
			out[name] = &outbox{}
		}
		return out[name]
	}
	needResync := false
	if standbys {
		for name := range cur.epochs {
			if name != self && cur.up(name) && !own.syncedWith(name) {
				needResync = true
			}
		}
	}
	// A round with no change of configuration since the last round that
	// delivered everything finds no token to collect (imports bring only
	// keys this node acts for), unless that round kept keys nobody could
	// decide then. update resets scanned on every change of configuration.
	scan := handoffScan{config: cur.id, epoch: own.epoch}
	h.mu.Lock()
	last := h.scanned
	h.mu.Unlock()
	if last != scan || last.orphans || needResync {
		var mu sync.Mutex
		_, err := r.cfg.Engine.Collect(ctx, func(key string) bool {
			a := cur.actingName(key)
			if a == "" {
				mu.Lock()
				scan.orphans = true
				mu.Unlock()
			}
			if a == self {
				if !needResync {
					return false
				}
				sb := cur.standby(key)
				return sb != "" && !own.syncedFor(key, sb)
			}
			return a != ""
		}, func(x actor.Exported) error {
			mu.Lock()
			defer mu.Unlock()
			if a := cur.actingName(x.Key); a != self {
				b := box(a)
				b.tokens = append(b.tokens, x)
				return nil
			}
			b := box(cur.standby(x.Key))
			b.resync = append(b.resync, persist.Record{Key: x.Key, Deadline: x.Deadline, Value: x.State})
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("collect the keys to hand over: %w", err)
		}
	} else {
		scan = last
	}
	if standbys {
		if err := r.collectCopies(ctx, own, box); err != nil {
			return 0, err
		}
	}

	// Queue every resync now, in place (see above), and wait for them
	// below.
	resyncs := make(map[string]func(context.Context) error)
	for name := range cur.epochs {
		if name != self && standbys && cur.up(name) && !own.syncedWith(name) {
			resyncs[name] = r.send(ctx, own, name, box(name).resync)
		}
	}
	r.resyncs.Unlock()
	locked = false

	sent := 0
	var wg sync.WaitGroup
	errs := make(chan error, len(cur.epochs))
	for name, epoch := range cur.epochs {
		if name == self {
			continue
		}
		m, _ := cur.members[name]
		b := box(name)
		done := handedTo{epoch: epoch, config: cur.id, seq: seq}
		h.mu.Lock()
		told := h.handedTo[name] == done
		h.mu.Unlock()
		wait, resync := resyncs[name]
		if len(b.tokens) == 0 && len(b.copies) == 0 && told && !resync {
			continue // told already, and nothing new for it
		}
		sent += len(b.tokens)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if len(b.tokens) > 0 || len(b.copies) > 0 || !told {
				if err := r.handTo(ctx, m, epoch, own.epoch, cur.id, seq, version, b); err != nil {
					errs <- fmt.Errorf("to %s: %w", name, err)
					return
				}
				h.mu.Lock()
				h.handedTo[name] = done
				h.mu.Unlock()
			}
			if resync {
				if err := wait(ctx); err != nil {
					errs <- fmt.Errorf("bring standby %s up to date: %w", name, err)
					return
				}
				mark := syncMark{cfg: cur, epoch: epoch}
				r.amend(func(o *ownership) *ownership {
					if o.cur.id != cur.id || o.epoch != own.epoch {
						return o // moved on meanwhile: the next round does it again
					}
					return o.amended(func(n *ownership) {
						n.synced = cloneMap(o.synced)
						n.synced[name] = mark
					})
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if promoted && len(all) == 0 {
		r.amend(func(o *ownership) *ownership {
			if o.cur.id != cur.id || o.epoch != own.epoch {
				return o
			}
			return o.amended(func(n *ownership) { n.promoted = cur.id })
		})
	}
	if len(all) > 0 {
		return sent, errors.Join(all...)
	}
	h.mu.Lock()
	h.scanned = scan
	h.lastRound = cur
	h.mu.Unlock()
	if err := r.reportSynced(ctx, own.epoch, cur, scan.orphans); err != nil {
		return sent, err
	}
	if sent == 0 && !scan.orphans {
		h.mu.Lock()
		select {
		case <-h.idle:
		default:
			if latest := r.own.Load(); latest.epoch == own.epoch && latest.cur.id == cur.id {
				close(h.idle)
			}
		}
		h.mu.Unlock()
	}
	return sent, nil
}

// reportSynced writes this node's synced mark for configuration cur to the
// map, once per configuration and epoch, when a round left everything in
// place: with standbys, every standby of its keys is up to date and its
// copies are promoted, and the ownership has settled; with one replica,
// only while it is leaving and nothing is left to hand over (its keys then
// go on without waiting for it).
func (r *Router) reportSynced(ctx context.Context, epoch uint64, cur *config, orphans bool) error {
	own := r.own.Load()
	if own.epoch != epoch || own.cur.id != cur.id {
		return nil // moved on: the next round reports
	}
	x := cur.members[r.cfg.Self]
	if !x.Live || x.Epoch != epoch || x.Synced >= cur.id {
		return nil
	}
	if cur.replicas >= 2 {
		if !own.settled {
			return nil
		}
	} else if x.Phase != control.PhaseLeaving || orphans {
		return nil
	}
	h := &r.handoffs
	want := syncReport{epoch: epoch, config: cur.id}
	h.mu.Lock()
	done := h.reported == want
	h.mu.Unlock()
	if done {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := r.ctl().ReportSynced(rctx, cur.id); err != nil {
		return fmt.Errorf("write this node's synced mark: %w", err)
	}
	h.mu.Lock()
	h.reported = want
	h.mu.Unlock()
	r.log.Debug("synced mark written", "config", cur.id, "epoch", epoch)
	return nil
}

// outbox is what one round sends one member.
type outbox struct {
	tokens []actor.Exported // keys it acts for that this node holds
	copies []actor.Exported // copies this node keeps of keys it gained
	resync []persist.Record // full states of this node's keys it is the standby of
}

// promote merges the copies this node keeps of keys it acts for now into
// those keys (it took them over from a member whose epoch ended),
// replicates them to their standbys, and drops the copies.
func (r *Router) promote(ctx context.Context, own *ownership) error {
	// Standby writes admitted under an older ownership finish first, so
	// that their copies are merged too; later ones are checked against
	// this ownership (a sender whose epoch ended is refused).
	r.copies.Lock()
	r.copies.Unlock()
	var states []actor.Exported
	_, err := r.cfg.Engine.CollectReplicas(ctx, func(key string) bool {
		return own.cur.actingName(key) == r.cfg.Self
	}, func(x actor.Exported) error {
		states = append(states, x)
		return nil
	})
	if err != nil || len(states) == 0 {
		return err
	}
	if err := r.cfg.Engine.Import(ctx, states); err != nil {
		return err
	}
	keys := make([]string, len(states))
	for i := range states {
		keys[i] = states[i].Key
	}
	r.log.Info("took over keys from their copies here", "keys", len(keys))
	return r.cfg.Engine.DeleteReplicas(ctx, keys)
}

// collectCopies adds to each member's outbox the copies this node keeps of
// keys that member gained since this node's last round (it acts for them
// now and did not then), or of every key it acts for if it came back under
// a new epoch (so that a node that lost its disk is filled).
func (r *Router) collectCopies(ctx context.Context, own *ownership, box func(string) *outbox) error {
	cur := own.cur
	h := &r.handoffs
	h.mu.Lock()
	prev := h.lastRound
	fresh := make(map[string]bool)
	for name, epoch := range cur.epochs {
		if h.handedTo[name].epoch != epoch {
			fresh[name] = true
		}
	}
	h.mu.Unlock()
	gained := func(key string) bool {
		a := cur.actingName(key)
		if a == "" || a == r.cfg.Self {
			return false
		}
		if prev != nil {
			// The member that acted for the key before, if it is still
			// live in the same epoch, hands the key over itself: a copy
			// too would reach the receiver as a second state of the same
			// history, and a receiver whose own state has another lineage
			// would count its hits twice.
			if p := prev.actingName(key); p != "" && p != a && (p == r.cfg.Self || cur.live(p) && cur.epochs[p] == prev.epochs[p]) {
				return false
			}
		}
		return fresh[a] || prev == nil || prev.actingName(key) != a
	}
	var mu sync.Mutex
	_, err := r.cfg.Engine.CollectReplicas(ctx, gained, func(x actor.Exported) error {
		mu.Lock()
		defer mu.Unlock()
		b := box(cur.actingName(x.Key))
		b.copies = append(b.copies, x)
		return nil
	})
	if err != nil {
		return fmt.Errorf("collect the copies to send: %w", err)
	}
	return nil
}

// handTo delivers b's tokens to member m (epoch toEpoch) in chunks,
// forgetting each chunk here once m committed it, then b's copies (kept
// here), then sends m the complete for configuration id.
//
// A part whose answer does not come (a timeout, the round cancelled by a
// newer ownership, m's standby not confirming after m committed) leaves
// its keys here, though m may hold them: they count on both, which only
// denies more. Sent again, they count once on m, which keeps a receipt of
// each state it added up with its own (see actor.Engine.Import). A key
// this node acts for again before it sent it again is not sent again: m
// hands its state back, split by history (actor.Exported.Parts), and the
// history this node kept joins with what it kept, each hit once. (Waiting
// for the answer of a part after its round was cancelled is not safe:
// under the newer ownership m may hand the key back before Forget runs,
// and if what comes back encodes as what was collected, Forget deletes it
// here after m forgot it too, and the key's hits are nowhere.)
func (r *Router) handTo(ctx context.Context, m control.Member, toEpoch, fromEpoch, id, seq, version uint64, b *outbox) error {
	p, err := r.peers.get(m.Name)
	if err != nil {
		return err
	}
	keys := append(slices.Clip(b.tokens), b.copies...)
	tokens := len(b.tokens)
	for start := 0; start < len(keys) || start == 0; start += handoffChunk {
		part := keys[start:min(start+handoffChunk, len(keys))]
		last := start+handoffChunk >= len(keys)
		req := &sluicepb.HandoffRequest{
			FromNode: r.cfg.Self, FromEpoch: fromEpoch, Config: id, Complete: last, Sequence: seq,
			ToNode: m.Name, ToEpoch: toEpoch, MapVersion: version,
			Keys: make([]*sluicepb.KeyRecord, 0, len(part)),
		}
		for _, x := range part {
			// A key that took in other histories goes split by history
			// (actor.Exported.Parts): one m handed over and kept joins
			// with m's copy instead of counting twice.
			for _, y := range x.Split() {
				req.Keys = append(req.Keys, &sluicepb.KeyRecord{Key: []byte(y.Key), State: y.State})
			}
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.HandoffTimeout)
		_, err := p.client.Handoff(cctx, req)
		r.log.Debug("handoff part", "to", m.Name, "to_epoch", toEpoch, "config", id, "complete", last, "keys", len(part), "err", err)
		cancel()
		r.cfg.Observer.HandedOff(m.Name, len(part), err)
		if err != nil {
			return fromPeerStatus(m.Name, err)
		}
		if delivered := part[:max(0, min(len(part), tokens-start))]; len(delivered) > 0 {
			// Delivered and committed there: forget it here, unless it
			// changed meanwhile (then it goes in the next round).
			if _, err := r.cfg.Engine.Forget(context.WithoutCancel(ctx), delivered); err != nil {
				return fmt.Errorf("forget %d delivered keys: %w", len(delivered), err)
			}
		}
		if len(keys) == 0 {
			break
		}
	}
	return nil
}

// receiveHandoff merges handed-over states (committed before it returns)
// and records the sender's complete. It first applies at least the map
// version the sender acted under. It takes only keys this node acts for
// in its own configuration: were it to take others, a complete it already
// sent for them would be false. The sender keeps refused keys and tries
// again once the configurations agree.
func (r *Router) receiveHandoff(ctx context.Context, req *sluicepb.HandoffRequest) (int, error) {
	if !r.joined() {
		return 0, fmt.Errorf("%w: this node is not in a cluster", errWrongEpoch)
	}
	if err := r.catchUp(ctx, req.MapVersion); err != nil {
		return 0, err
	}
	r.resyncs.RLock()
	defer r.resyncs.RUnlock()
	r.imports.RLock()
	defer r.imports.RUnlock()
	own := r.own.Load()
	if req.ToNode != r.cfg.Self || req.ToEpoch != own.epoch {
		return 0, fmt.Errorf("%w: meant for %s epoch %d; this is %s epoch %d", errWrongEpoch, req.ToNode, req.ToEpoch, r.cfg.Self, own.epoch)
	}
	states := make([]actor.Exported, len(req.Keys))
	for i, k := range req.Keys {
		states[i] = actor.Exported{Key: string(k.Key), State: k.State}
		if a := own.cur.actingName(states[i].Key); a != r.cfg.Self {
			return 0, fmt.Errorf("%w: %s does not act for key %s in its configuration (%s does); the configurations differ for a moment", errMisrouted, r.cfg.Self, actor.QuoteKey(states[i].Key), a)
		}
	}
	// With standbys, what arrived is on this node's standbys before the
	// sender forgets it: the import's write goes to them (the Replicator)
	// in the actors' write order, after the key's earlier writes and
	// before its later ones, and Import returns once they took it. (A
	// merged state read back and sent apart could overtake a decision's
	// copy and roll the standby's copy back past it.)
	if err := r.cfg.Engine.Import(ctx, states); err != nil {
		if errors.Is(err, actor.ErrReplication) {
			return 0, fmt.Errorf("%w: %v", ErrMoving, err)
		}
		return 0, err
	}
	r.cfg.Observer.HandoffReceived(req.FromNode, len(states))
	r.log.Debug("handoff received", "from", req.FromNode, "config", req.Config, "complete", req.Complete, "keys", len(states))
	if req.Complete && own.cur.epochs[req.FromNode] == req.FromEpoch {
		c := complete{epoch: req.FromEpoch, config: req.Config, seq: req.Sequence}
		r.amend(func(o *ownership) *ownership {
			if o.epoch != req.ToEpoch {
				return o // this node moved to a new epoch meanwhile
			}
			if old, ok := o.completes[req.FromNode]; ok && old.epoch == c.epoch && old.seq > c.seq {
				return o // an older message overtaken by a newer one
			}
			return o.with(req.FromNode, c)
		})
	}
	return len(states), nil
}

// OnlyOwner reports whether this node is the only member that owns keys:
// it has nobody to hand them to.
func (r *Router) OnlyOwner() bool {
	if !r.joined() {
		return true
	}
	ring := r.own.Load().cur.ring
	return len(ring) == 0 || len(ring) == 1 && ring[0] == r.cfg.Self
}

// Leave ends this node's part in a graceful shutdown, within ctx: it
// stops deciding, leaves its keys complete elsewhere if it can, and ends
// its epoch (it stays a member: a rolling restart changes no Raft
// configuration). With standbys it waits until its synced mark covers the
// current configuration, so that its keys go on from their copies at
// once; with one replica it moves to phase leaving and hands every key to
// the members that act for it now. If ctx ends first, it ends its epoch
// anyway: its keys then wait for it (policy exact) until it is back. The
// only member that owns keys has nobody to hand them to, nor copies to
// bring up to date: it ends its epoch at once.
func (r *Router) Leave(ctx context.Context) error {
	if !r.joined() {
		return nil
	}
	if own := r.own.Load(); own.cur.parts != nil {
		// Partitions: hand each one this node leads to an in-sync replica
		// in the entry that ends its epoch, keeping half the time for
		// that entry.
		dctx, cancel := ctx, context.CancelFunc(func() {})
		if d, ok := ctx.Deadline(); ok {
			dctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
		}
		targets := r.Drain(dctx)
		cancel()
		return r.ctl().LeaveWith(ctx, targets)
	}
	if r.OnlyOwner() {
		return r.ctl().Leave(ctx)
	}
	// Keep a third of the time for ending the epoch itself.
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if d, ok := ctx.Deadline(); ok {
		wctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(d)*2/3))
	}
	defer cancel()
	var err error
	if r.cfg.Replicas < 2 {
		if err = r.ctl().SetLeaving(wctx); err != nil {
			r.log.Warn("move to phase leaving", "err", err)
		}
	}
	if err == nil {
		err = r.waitSynced(wctx)
	}
	if err != nil {
		r.log.Warn("could not leave every key complete elsewhere; its keys wait for this node", "err", err)
	}
	return r.ctl().Leave(ctx)
}

// waitSynced waits until the map records this node's synced mark for its
// current configuration.
func (r *Router) waitSynced(ctx context.Context) error {
	for {
		m, changed := r.ctl().Watch()
		x, ok := m.Member(r.cfg.Self)
		if !ok || !x.Live {
			return fmt.Errorf("cluster: this node's epoch is not live")
		}
		if x.Synced >= m.Changed && x.Synced > 0 {
			return nil
		}
		kick(r.handoffs.kick)
		select {
		case <-changed:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			own := r.own.Load()
			return fmt.Errorf("cluster: leave: copies not complete in time (waiting for %v): %w", own.waitingFor, ctx.Err())
		}
	}
}
