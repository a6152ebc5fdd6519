package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-io/sluice/actor"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/shard"
)

// handoffChunk is how many keys one HandoffRequest carries.
const handoffChunk = 500

// HandOver sends the state of every key that this node holds but that view
// gives to another member to that member, and forgets it here. A key whose
// new owner cannot be reached is merged back here, so no state is lost; it
// moves on the next view change. It returns how many keys moved.
func (r *Router) HandOver(ctx context.Context, view *View) (int, error) {
	self := r.cfg.Self
	moved := func(key string) bool {
		o := view.Owner(key)
		return o.Name != "" && o.Name != self
	}
	byOwner := make(map[string][]actor.Exported)
	var mu sync.Mutex
	_, err := r.cfg.Engine.Export(ctx, moved, func(x actor.Exported) error {
		mu.Lock()
		defer mu.Unlock()
		o := view.Owner(x.Key).Name
		byOwner[o] = append(byOwner[o], x)
		return nil
	})
	sent := 0
	for _, m := range view.Members {
		if m.Name == self {
			continue
		}
		keys := byOwner[m.Name]
		if serr := r.sendHandoff(ctx, view, m.Name, keys); serr != nil {
			r.log.Warn("handoff failed; keeping the keys here", "to", m.Name, "keys", len(keys), "err", serr)
			if ierr := r.cfg.Engine.Import(context.WithoutCancel(ctx), keys); ierr != nil {
				return sent, fmt.Errorf("cluster: handoff to %s failed (%v) and the keys could not be merged back: %w", m.Name, serr, ierr)
			}
			continue
		}
		sent += len(keys)
	}
	return sent, err
}

// sendHandoff streams keys to peer name, in chunks. An empty stream tells
// the peer that this node has nothing (more) for it.
func (r *Router) sendHandoff(ctx context.Context, view *View, name string, keys []actor.Exported) error {
	p, err := r.peer(view, name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.handoffTimeout())
	defer cancel()
	stream, err := p.client.Handoff(ctx)
	if err != nil {
		return err
	}
	for start := 0; start < len(keys) || start == 0; start += handoffChunk {
		part := keys[start:min(start+handoffChunk, len(keys))]
		req := &sluicepb.HandoffRequest{FromNode: r.cfg.Self, Epoch: view.Epoch, OwnersHash: view.ownersHash(), Keys: make([]*sluicepb.KeyRecord, len(part))}
		for i, x := range part {
			req.Keys[i] = &sluicepb.KeyRecord{Key: []byte(x.Key), State: x.State}
		}
		if err := stream.Send(req); err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
	}
	_, err = stream.CloseAndRecv()
	r.cfg.Observer.HandedOff(name, len(keys), err)
	return err
}

func (r *Router) handoffTimeout() time.Duration {
	if r.cfg.HandoffTimeout > 0 {
		return r.cfg.HandoffTimeout
	}
	return 30 * time.Second
}

// Follow hands keys over on every view change until ctx ends, and keeps
// the barrier that holds decisions on gained keys until their previous
// owner's handoff arrived (or HandoffWait passed).
func (r *Router) Follow(ctx context.Context) {
	views, stop := r.cfg.Membership.Subscribe()
	defer stop()
	var prev *View
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-views:
			if !ok {
				return
			}
			v = Owners(v)
			if prev == nil && v.Len() > 1 {
				// This node joined a cluster: the keys it owns were the
				// others'; hold them until their handoffs arrive.
				prev = NewView(0, nil)
			}
			if prev != nil {
				r.gain(prev, v)
				n, err := r.HandOver(ctx, v)
				if err != nil {
					r.log.Error("hand keys over", "epoch", v.Epoch, "err", err)
				} else if n > 0 {
					r.log.Info("handed keys over", "epoch", v.Epoch, "keys", n)
				}
			}
			prev = v
		}
	}
}

// barrier holds decisions on keys this node gained in a view change until
// the previous owner's handoff arrived, for at most HandoffWait.
type barrier struct {
	prev    *View
	next    uint64 // ownersHash of the view this barrier is for
	until   time.Time
	waiting map[string]chan struct{} // previous owners not heard from yet
}

func (r *Router) handoffWait() time.Duration {
	if r.cfg.HandoffWait > 0 {
		return r.cfg.HandoffWait
	}
	return 2 * time.Second
}

// gain starts a barrier for the change from prev to next: every member of
// both views other than this node may hand keys over to it.
func (r *Router) gain(prev, next *View) {
	if !prev.has(r.cfg.Self) || prev.Len() <= 1 {
		// This node just joined: the keys it gains were owned by the others.
		var others []Member
		for _, m := range next.Members {
			if m.Name != r.cfg.Self {
				others = append(others, m)
			}
		}
		prev = NewView(prev.Epoch, others)
	}
	b := &barrier{prev: prev, next: next.ownersHash(), until: time.Now().Add(r.handoffWait()), waiting: make(map[string]chan struct{})}
	live := make(map[string]bool)
	for _, m := range r.cfg.Membership.View().Members {
		live[m.Name] = true // leaving members still hand keys over
	}
	r.hmu.Lock()
	defer r.hmu.Unlock()
	for _, m := range prev.Members {
		if m.Name == r.cfg.Self || !live[m.Name] {
			continue // a member that is gone hands nothing over
		}
		if r.heard[m.Name] == b.next {
			continue // its handoff for this change already arrived
		}
		b.waiting[m.Name] = make(chan struct{})
	}
	r.barrier = b
}

// HandoffReceived records that name finished a handoff stream to this node,
// computed from the owners whose ownersHash is owners.
func (r *Router) HandoffReceived(name string, owners uint64) {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	if r.heard == nil {
		r.heard = make(map[string]uint64)
	}
	r.heard[name] = owners
	if b := r.barrier; b != nil && b.next == owners {
		if ch, ok := b.waiting[name]; ok {
			close(ch)
			delete(b.waiting, name)
		}
	}
}

// AwaitHandoff is awaitHandoff for checks another node forwarded here.
func (r *Router) AwaitHandoff(ctx context.Context, checks []actor.Check) {
	if n := r.awaitHandoff(ctx, checks); n > 0 {
		r.cfg.Observer.WithoutHandoff(n)
	}
}

// awaitHandoff waits, for the local checks, until the previous owner of
// each gained key has handed it over, or the barrier's time is up. It
// reports how many checks are decided without their handed-over state.
func (r *Router) awaitHandoff(ctx context.Context, checks []actor.Check) int {
	r.hmu.Lock()
	b := r.barrier
	r.hmu.Unlock()
	if b == nil || time.Now().After(b.until) {
		return 0
	}
	missing := 0
	for i := range checks {
		r.hmu.Lock()
		ch := b.waiting[b.prev.Owner(checks[i].Key).Name]
		r.hmu.Unlock()
		if ch == nil {
			continue
		}
		wait := time.Until(b.until)
		if wait <= 0 {
			missing++
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
			missing++
		case <-ctx.Done():
			missing++
		}
		t.Stop()
	}
	return missing
}

// has reports whether the view holds a member named name.
func (v *View) has(name string) bool {
	for _, m := range v.Members {
		if m.Name == name {
			return true
		}
	}
	return false
}

// ownersHash identifies the set of members of v.
func (v *View) ownersHash() uint64 {
	var b []byte
	for _, m := range v.Members {
		b = append(append(b, m.Name...), 0)
	}
	return shard.Hash(string(b))
}
