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
		case <-r.handoffKick:
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
		case <-r.handoffKick:
			cancel()
			<-done
			kick(r.handoffKick) // a new round at once, for the newer ownership
			continue
		case <-ctx.Done():
			cancel()
			<-done
			return
		}
		err := res.err
		if err == nil {
			backoff = handoffBackoffMin
			if res.sent > 0 {
				kick(r.handoffKick) // make sure nothing was left behind
			}
			continue
		}
		if ctx.Err() == nil {
			r.log.Warn("handoff incomplete; retrying", "err", err, "retry_in", backoff)
		}
		retry = time.After(time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())))
		backoff = min(2*backoff, handoffBackoffMax)
	}
}

// handoffRound sends every key this node holds but does not act for to
// the member that acts for it, forgets each once delivered, and then tells
// every live member it has nothing more for it in this configuration. Keys
// whose owner is down and that nobody may decide stay here until it is
// back. It returns how many keys it delivered, and nil once every member
// got its keys and its complete. A round that delivers nothing, finds
// every member told and keeps no key that nobody may decide marks the
// router idle (see HandOver).
func (r *Router) handoffRound(ctx context.Context) (int, error) {
	// Imports admitted under an older ownership finish before the keys are
	// collected, so that what they brought is collected too; later ones
	// are checked against this ownership.
	r.imports.Lock()
	own := r.own.Load()
	r.imports.Unlock()
	cur := own.cur
	r.ownMu.Lock()
	seq := r.seq
	r.ownMu.Unlock()
	self := r.cfg.Self
	standbys := cur.replicas >= 2

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
		for name := range cur.alive {
			if name != self && !own.syncedWith(name) {
				needResync = true
			}
		}
	}
	// A round with no change of configuration since the last round that
	// delivered everything finds no token to collect (imports bring only
	// keys this node acts for), unless that round kept keys nobody could
	// decide then (their owner was down). update resets scanned on every
	// change of configuration.
	scan := handoffScan{config: cur.id, inc: own.inc}
	r.handoffMu.Lock()
	last := r.scanned
	r.handoffMu.Unlock()
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

	sent := 0
	var wg sync.WaitGroup
	errs := make(chan error, len(cur.alive))
	for name, m := range cur.alive {
		if name == self {
			continue
		}
		b := box(name)
		done := handedTo{inc: m.Incarnation, config: cur.id, seq: seq}
		r.handoffMu.Lock()
		told := r.handedTo[name] == done
		r.handoffMu.Unlock()
		resync := standbys && !own.syncedWith(name)
		if len(b.tokens) == 0 && len(b.copies) == 0 && told && !resync {
			continue // told already, and nothing new for it
		}
		sent += len(b.tokens)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if len(b.tokens) > 0 || len(b.copies) > 0 || !told {
				if err := r.handTo(ctx, m, own.inc, cur.id, seq, b); err != nil {
					errs <- fmt.Errorf("to %s: %w", name, err)
					return
				}
				r.handoffMu.Lock()
				r.handedTo[name] = done
				r.handoffMu.Unlock()
			}
			if resync {
				if err := r.sendAndWait(ctx, own, name, b.resync); err != nil {
					errs <- fmt.Errorf("bring standby %s up to date: %w", name, err)
					return
				}
				mark := syncMark{cfg: cur, inc: m.Incarnation}
				r.amend(func(o *ownership) *ownership {
					if o.cur.id != cur.id || o.inc != own.inc {
						return o // moved on meanwhile: the next round does it again
					}
					return o.amended(r.clk.Now(), func(n *ownership) {
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
			if o.cur.id != cur.id || o.inc != own.inc {
				return o
			}
			return o.amended(r.clk.Now(), func(n *ownership) { n.promoted = cur.id })
		})
	}
	if len(all) == 0 {
		r.handoffMu.Lock()
		r.scanned = scan
		r.lastRound = cur
		r.handoffMu.Unlock()
	}
	if len(all) == 0 && sent == 0 && !scan.orphans {
		r.handoffMu.Lock()
		select {
		case <-r.handoffIdle:
		default:
			if r.own.Load() == own {
				close(r.handoffIdle)
			}
		}
		r.handoffMu.Unlock()
	}
	return sent, errors.Join(all...)
}

// outbox is what one round sends one member.
type outbox struct {
	tokens []actor.Exported // keys it acts for that this node holds
	copies []actor.Exported // copies this node keeps of keys it gained
	resync []persist.Record // full states of this node's keys it is the standby of
}

// promote merges the copies this node keeps of keys it acts for now into
// those keys (it took them over from their owner, down), replicates them to
// their standbys, and drops the copies.
func (r *Router) promote(ctx context.Context, own *ownership) error {
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
// a new incarnation (so that a node that lost its disk is filled).
func (r *Router) collectCopies(ctx context.Context, own *ownership, box func(string) *outbox) error {
	cur := own.cur
	r.handoffMu.Lock()
	prev := r.lastRound
	fresh := make(map[string]bool)
	for name, m := range cur.alive {
		if r.handedTo[name].inc != m.Incarnation {
			fresh[name] = true
		}
	}
	r.handoffMu.Unlock()
	gained := func(key string) bool {
		a := cur.actingName(key)
		if a == "" || a == r.cfg.Self {
			return false
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

// handoffScan describes the last round that delivered everything it
// collected: for which configuration and incarnation, and whether it kept
// keys nobody could decide.
type handoffScan struct {
	config, inc uint64
	orphans     bool
}

// handTo delivers b's tokens to member m in chunks, forgetting each chunk
// here once m committed it, then b's copies (kept here), then sends m the
// complete for configuration id.
func (r *Router) handTo(ctx context.Context, m Member, inc, id, seq uint64, b *outbox) error {
	p, err := r.peer(m.Name)
	if err != nil {
		return err
	}
	keys := append(slices.Clip(b.tokens), b.copies...)
	tokens := len(b.tokens)
	for start := 0; start < len(keys) || start == 0; start += handoffChunk {
		part := keys[start:min(start+handoffChunk, len(keys))]
		last := start+handoffChunk >= len(keys)
		req := &sluicepb.HandoffRequest{
			FromNode: r.cfg.Self, FromIncarnation: inc, Config: id, Complete: last, Sequence: seq,
			ToNode: m.Name, ToIncarnation: m.Incarnation,
			Keys: make([]*sluicepb.KeyRecord, len(part)),
		}
		for i, x := range part {
			req.Keys[i] = &sluicepb.KeyRecord{Key: []byte(x.Key), State: x.State}
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.HandoffTimeout)
		_, err := p.client.Handoff(cctx, req)
		r.log.Debug("handoff part", "to", m.Name, "to_incarnation", m.Incarnation, "config", id, "complete", last, "keys", len(part), "err", err)
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

// exportedKeys lists the keys of xs, for debug logs.
// receiveHandoff merges handed-over states (committed before it returns)
// and records the sender's complete. It takes only keys this node acts
// for in its own configuration: were it to take others, a complete it
// already sent for them would be false. The sender keeps refused keys and
// tries again once the configurations agree.
func (r *Router) receiveHandoff(ctx context.Context, req *sluicepb.HandoffRequest) (int, error) {
	if r.cfg.Membership == nil {
		return 0, fmt.Errorf("%w: this node is not in a cluster", errWrongIncarnation)
	}
	r.imports.RLock()
	defer r.imports.RUnlock()
	own := r.own.Load()
	if req.ToNode != r.cfg.Self || req.ToIncarnation != own.inc {
		return 0, fmt.Errorf("%w: meant for %s incarnation %d; this is %s incarnation %d", errWrongIncarnation, req.ToNode, req.ToIncarnation, r.cfg.Self, own.inc)
	}
	states := make([]actor.Exported, len(req.Keys))
	for i, k := range req.Keys {
		states[i] = actor.Exported{Key: string(k.Key), State: k.State}
		if a := own.cur.actingName(states[i].Key); a != r.cfg.Self {
			return 0, fmt.Errorf("%w: %s does not act for key %s in its configuration (%s does); the configurations differ for a moment", errMisrouted, r.cfg.Self, actor.QuoteKey(states[i].Key), a)
		}
	}
	if err := r.cfg.Engine.Import(ctx, states); err != nil {
		return 0, err
	}
	// With standbys, what arrived is on this node's standbys before the
	// sender forgets it: the merged states, read back.
	if r.cfg.Replicas >= 2 && len(states) > 0 {
		keys := make([]string, len(states))
		for i := range states {
			keys[i] = states[i].Key
		}
		merged, err := r.cfg.Engine.Get(ctx, keys)
		if err != nil {
			return 0, err
		}
		if err := r.replicateStates(ctx, own, merged); err != nil {
			return 0, fmt.Errorf("%w: %v", ErrMoving, err)
		}
	}
	r.cfg.Observer.HandoffReceived(req.FromNode, len(states))
	r.log.Debug("handoff received", "from", req.FromNode, "config", req.Config, "complete", req.Complete, "keys", len(states))
	if req.Complete {
		c := complete{inc: req.FromIncarnation, config: req.Config, seq: req.Sequence}
		r.amend(func(o *ownership) *ownership {
			if o.inc != req.ToIncarnation {
				return o // this node moved to a new incarnation meanwhile
			}
			if old, ok := o.completes[req.FromNode]; ok && old.inc == c.inc && old.seq > c.seq {
				return o // an older message overtaken by a newer one
			}
			return o.with(req.FromNode, &c, nil, r.clk.Now())
		})
	}
	return len(states), nil
}

// OnlyOwner reports whether this node is the only member that owns keys:
// it has nobody to hand them to, and stops without leaving.
func (r *Router) OnlyOwner() bool {
	if r.cfg.Membership == nil {
		return true
	}
	owners := r.own.Load().cur.owners
	_, self := owners.Member(r.cfg.Self)
	return owners.Len() == 0 || owners.Len() == 1 && self
}

// HandOver hands every key this node holds to the members that act for
// them and returns once everything was delivered (nil) or ctx ended. A
// leaving node calls it after announcing that it leaves, so that it acts
// for nothing. Keys whose owner is down cannot be delivered: HandOver then
// waits until ctx ends, and the node must stop without leaving, so that
// the keys wait for it rather than vanish.
func (r *Router) HandOver(ctx context.Context) error {
	if r.cfg.Membership == nil {
		return nil
	}
	// The view in which this node is leaving is the membership's now, but
	// the router follows views on a goroutine of its own: adopt it here, so
	// that no round runs (and finds nothing to hand over) under the
	// ownership in which this node still acts for its keys.
	r.update(r.cfg.Membership.View(), r.cfg.Membership.Incarnation())
	for {
		r.handoffMu.Lock()
		idle := make(chan struct{})
		r.handoffIdle = idle
		r.handoffMu.Unlock()
		own := r.own.Load()
		kick(r.handoffKick)
		select {
		case <-idle:
			if r.own.Load() == own {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("cluster: hand keys over: %w", ctx.Err())
		}
	}
}
