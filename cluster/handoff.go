package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluice-io/sluice/actor"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// handoffChunk is how many keys one Handoff call carries.
const handoffChunk = 500

// Backoff of handoff rounds that could not deliver everything.
const (
	handoffBackoffMin = 200 * time.Millisecond
	handoffBackoffMax = 5 * time.Second
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
	byMember := make(map[string][]actor.Exported)
	// A round with no change of configuration since the last round that
	// delivered everything finds nothing new to collect (imports bring
	// only keys this node acts for), unless that round kept keys nobody
	// could decide then (their owner was down): it only has completes to
	// send (to a member that came back, say). update resets scanned on
	// every change of configuration.
	scan := handoffScan{config: cur.id, inc: own.inc}
	r.handoffMu.Lock()
	last := r.scanned
	r.handoffMu.Unlock()
	if last != scan || last.orphans {
		var mu sync.Mutex
		_, err := r.cfg.Engine.Collect(ctx, func(key string) bool {
			a := cur.actingName(key)
			if a == "" {
				mu.Lock()
				scan.orphans = true
				mu.Unlock()
			}
			return a != "" && a != self
		}, func(x actor.Exported) error {
			mu.Lock()
			defer mu.Unlock()
			a := cur.actingName(x.Key)
			byMember[a] = append(byMember[a], x)
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("collect the keys to hand over: %w", err)
		}
	} else {
		scan = last
	}
	sent := 0
	var wg sync.WaitGroup
	errs := make(chan error, len(cur.alive))
	for name, m := range cur.alive {
		if name == self {
			continue
		}
		keys := byMember[name]
		done := handedTo{inc: m.Incarnation, config: cur.id, seq: seq}
		r.handoffMu.Lock()
		last := r.handedTo[name]
		r.handoffMu.Unlock()
		if len(keys) == 0 && last == done {
			continue // told already, and nothing new for it
		}
		sent += len(keys)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.handTo(ctx, m, own.inc, cur.id, seq, keys); err != nil {
				errs <- fmt.Errorf("to %s: %w", name, err)
				return
			}
			r.handoffMu.Lock()
			r.handedTo[name] = done
			r.handoffMu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if len(all) == 0 {
		r.handoffMu.Lock()
		r.scanned = scan
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

// handoffScan describes the last round that delivered everything it
// collected: for which configuration and incarnation, and whether it kept
// keys nobody could decide.
type handoffScan struct {
	config, inc uint64
	orphans     bool
}

// handTo delivers keys to member m in chunks, forgetting each chunk here
// once m committed it, then sends m the complete for configuration id.
func (r *Router) handTo(ctx context.Context, m Member, inc, id, seq uint64, keys []actor.Exported) error {
	p, err := r.peer(m.Name)
	if err != nil {
		return err
	}
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
		cancel()
		r.cfg.Observer.HandedOff(m.Name, len(part), err)
		if err != nil {
			return fromPeerStatus(m.Name, err)
		}
		if len(part) > 0 {
			// Delivered and committed there: forget it here, unless it
			// changed meanwhile (then it goes in the next round).
			if _, err := r.cfg.Engine.Forget(context.WithoutCancel(ctx), part); err != nil {
				return fmt.Errorf("forget %d delivered keys: %w", len(part), err)
			}
		}
		if len(keys) == 0 {
			break
		}
	}
	return nil
}

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
			return 0, fmt.Errorf("%w: %s does not act for key %q in its configuration (%s does); the configurations differ for a moment", errMisrouted, r.cfg.Self, printable(states[i].Key), a)
		}
	}
	if err := r.cfg.Engine.Import(ctx, states); err != nil {
		return 0, err
	}
	r.cfg.Observer.HandoffReceived(req.FromNode, len(states))
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
