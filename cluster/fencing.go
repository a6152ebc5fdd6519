package cluster

import (
	"context"
	"maps"
	"sync"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// renewLoop renews this node's lease every Lease/3 until ctx ends, and
// reports to the observer what this node could not serve meanwhile.
func (r *Router) renewLoop(ctx context.Context) {
	every := r.cfg.Lease / 3
	t := r.clk.NewTimer(0)
	defer t.Stop()
	last := r.clk.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		r.renew(ctx, every)
		now := r.clk.Now()
		r.cfg.Observer.Unserved(now.Sub(last), !r.lease.valid(), !r.own.Load().settled)
		last = now
		t.Reset(every)
	}
}

// renew asks every live peer to grant this node's incarnation a lease, for
// at most timeout, and extends the lease from the time the requests were
// sent as soon as a majority of the expected members (this node included)
// granted it. A peer that answers "fenced" makes this node take a new
// incarnation: the old one will never be granted a lease again.
func (r *Router) renew(ctx context.Context, timeout time.Duration) {
	sent := r.lease.now()
	own := r.own.Load()
	inc := own.inc
	need := r.lease.quorum - 1
	if need <= 0 {
		r.lease.extend(sent)
		r.cfg.Observer.Renewed(true)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type answer struct{ granted, fenced bool }
	peers := r.livePeers(own)
	answers := make(chan answer, len(peers))
	for _, p := range peers {
		go func() {
			resp, err := p.client.Lease(ctx, &sluicepb.LeaseRequest{FromNode: r.cfg.Self, Incarnation: inc})
			if err != nil {
				answers <- answer{}
				return
			}
			answers <- answer{resp.Granted, resp.Fenced}
		}()
	}
	granted, fenced := 0, false
	for range peers {
		a := <-answers
		fenced = fenced || a.fenced
		if a.granted {
			if granted++; granted == need {
				r.lease.extend(sent)
			}
		}
	}
	r.cfg.Observer.Renewed(granted >= need)
	if fenced {
		r.fenced(inc)
	}
}

// fenced handles the news that incarnation inc of this node was fenced:
// its lease is void for good, so it takes a new incarnation, which holds no
// key until the others hand them back.
func (r *Router) fenced(inc uint64) {
	if r.cfg.Membership.Incarnation() != inc {
		return // moved on already
	}
	r.lease.drop()
	r.log.Warn("this node was fenced (the others took its keys over); starting a new incarnation", "incarnation", inc)
	if _, err := r.cfg.Membership.Reincarnate(r.cfg.Lease); err != nil {
		r.log.Warn("new incarnation", "err", err)
	}
	r.update(r.cfg.Membership.View(), r.cfg.Membership.Incarnation())
}

// promise makes this node refuse leases to member's incarnations up to
// inc. A promise about this node itself means the others took its keys
// over: it takes a new incarnation.
func (r *Router) promise(member string, inc uint64) error {
	if err := r.lease.promise(member, inc); err != nil {
		return err
	}
	if member == r.cfg.Self && inc >= r.cfg.Membership.Incarnation() {
		r.fenced(r.cfg.Membership.Incarnation())
	}
	return nil
}

// fenceLoop fences the owners that are down under the available policy or
// with standbys, so that the members after them in each key's order may
// act for their keys, and rebuilds the ownership when a fence's wait is
// over. Under the exact policy without standbys it has nothing to do.
func (r *Router) fenceLoop(ctx context.Context) {
	if r.cfg.Policy != PolicyAvailable && r.cfg.Replicas < 2 {
		return
	}
	t := r.clk.NewTimer(r.cfg.Lease)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.fenceKick:
		case <-t.C():
		}
		r.fenceDown(ctx)
		// Wake when a fence's wait ends, so that the gate sees it; and
		// retry fences that did not reach a majority.
		t.Reset(r.cfg.Lease / 3)
		if o := r.own.Load(); !o.settled && len(o.fenced) > 0 {
			r.amend(func(o *ownership) *ownership { return o.with("", nil, nil, r.clk.Now()) })
		}
	}
}

// fenceDown fences every owner that is down and not fenced yet in its
// current incarnation: this node and its live peers promise never to grant
// it a lease again, and once a majority of the expected members promised,
// this node may act for its keys after Lease·(1+ρ).
//
// It fences only while this node holds a lease, and only incarnations it
// saw alive and then fail: a node that has just started sees its roster's
// members down until gossip reaches them, and fencing those would force
// live nodes into new incarnations (the members that saw a node fail fence
// it).
func (r *Router) fenceDown(ctx context.Context) {
	if !r.lease.valid() {
		return
	}
	own := r.own.Load()
	r.ownMu.Lock()
	seen := maps.Clone(r.seenAlive)
	r.ownMu.Unlock()
	for _, m := range own.cur.owners.Members {
		if own.cur.up(m.Name) || m.Name == r.cfg.Self || seen[m.Name] < m.Incarnation {
			continue
		}
		if f, ok := own.fenced[m.Name]; ok && f.inc >= m.Incarnation {
			continue
		}
		if err := r.lease.promise(m.Name, m.Incarnation); err != nil {
			r.log.Error("fence", "member", m.Name, "err", err)
			continue
		}
		promised := 1
		var mu sync.Mutex
		var wg sync.WaitGroup
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Lease)
		for _, p := range r.livePeers(own) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := p.client.Fence(cctx, &sluicepb.FenceRequest{Member: m.Name, Incarnation: m.Incarnation, FromNode: r.cfg.Self}); err == nil {
					mu.Lock()
					promised++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		cancel()
		if promised < r.lease.quorum {
			r.log.Warn("could not fence a member that is down: not enough promises", "member", m.Name, "promised", promised, "quorum", r.lease.quorum)
			continue
		}
		f := fence{inc: m.Incarnation, at: r.clk.Now().Add(r.lease.fenceWait())}
		r.log.Info("fenced a member that is down", "member", m.Name, "incarnation", m.Incarnation, "act_from", f.at)
		r.amend(func(o *ownership) *ownership { return o.with(m.Name, nil, &f, r.clk.Now()) })
	}
}

// livePeers returns the senders of the live members of own other than
// this node (those that cannot be dialled left out).
func (r *Router) livePeers(own *ownership) []*peer {
	var peers []*peer
	for name := range own.cur.live {
		if name == r.cfg.Self {
			continue
		}
		if p, err := r.peer(name); err == nil {
			peers = append(peers, p)
		}
	}
	return peers
}
