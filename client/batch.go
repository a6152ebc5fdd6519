package client

import (
	"context"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// call is one Check waiting for its decision.
type call struct {
	check    Check
	deadline time.Time
	reply    chan result // capacity 1: the sender never blocks
}

// result is the answer to a call: Sluice's decision, or the error of the
// call that carried it.
type result struct {
	dec  *sluicepb.Decision
	info callInfo
	err  error
}

// lane is the way to one node: the checks of Check calls queued for it.
// A client that does not route has one lane, to the address given (the
// seed lane); one that routes has a lane per member besides, so that each
// node's checks are coalesced into calls of their own. The lanes share
// the client's call slots (Config.MaxInFlight calls in flight in all):
// checks queue while the slots are busy, whichever node they go to, so
// that a routing client's calls carry batches as large as one that sends
// everything to one node.
type lane struct {
	rl     sluicepb.RateLimitServiceClient
	routed bool // a member's lane, not the seed's
	queue  chan *call
	slots  chan struct{} // the client's
	// stop is closed when a member's lane retires (the member left the
	// view long ago); nil for the seed lane, which lasts until Close.
	stop chan struct{}
}

func (c *Client) newLane(rl sluicepb.RateLimitServiceClient, routed bool) *lane {
	l := &lane{rl: rl, routed: routed, queue: make(chan *call, c.cfg.MaxBatch*c.cfg.MaxInFlight*2), slots: c.slots}
	if routed {
		l.stop = make(chan struct{})
	}
	return l
}

// batchLoop gathers the checks of concurrent Check calls queued on l into
// calls to l's node: it takes a call slot (at most MaxInFlight calls in
// flight), then every check queued meanwhile, up to MaxBatch, waiting up
// to BatchWait for more if the batch is not full, and sends them in one
// call on a goroutine of their own. Under load, checks queue while the
// slots are busy and batches grow; an idle client sends each check at
// once. It returns when the client closes, or when l retires (its
// queued checks then go to the seed lane).
func (c *Client) batchLoop(l *lane) {
	defer c.wg.Done()
	var timer *time.Timer
	if c.cfg.BatchWait > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
	}
	for {
		var first *call
		select {
		case first = <-l.queue:
		case <-c.done:
			c.drain(l)
			return
		case <-l.stop:
			c.handOver(l)
			return
		}
		select {
		case l.slots <- struct{}{}:
		case <-c.done:
			first.reply <- result{err: ErrClosed}
			c.drain(l)
			return
		}
		batch := make([]*call, 1, min(c.cfg.MaxBatch, 1+len(l.queue)))
		batch[0] = first
	drain:
		for len(batch) < c.cfg.MaxBatch {
			select {
			case cl := <-l.queue:
				batch = append(batch, cl)
			default:
				break drain
			}
		}
		if timer != nil && len(batch) < c.cfg.MaxBatch {
			timer.Reset(c.cfg.BatchWait)
		wait:
			for len(batch) < c.cfg.MaxBatch {
				select {
				case cl := <-l.queue:
					batch = append(batch, cl)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		c.wg.Add(1)
		go c.send(l, batch)
	}
}

// drain fails the calls still queued on l when the client closes.
func (c *Client) drain(l *lane) {
	for {
		select {
		case cl := <-l.queue:
			cl.reply <- result{err: ErrClosed}
		default:
			return
		}
	}
}

// handOver moves the calls still queued on a retiring lane to the seed
// lane, whose node forwards them; a call that does not fit there fails
// with ErrClosed. (A lane retires a minute after its member left the
// view: by then nothing should be queued on it.)
func (c *Client) handOver(l *lane) {
	for {
		select {
		case cl := <-l.queue:
			select {
			case c.seed.queue <- cl:
			default:
				cl.reply <- result{err: ErrClosed}
			}
		default:
			return
		}
	}
}

// send makes one call to l's node of the batch's checks, under the latest
// of their deadlines (each caller stops waiting at its own), and answers
// each. Calls whose deadline already passed are left out.
func (c *Client) send(l *lane, batch []*call) {
	defer c.wg.Done()
	defer func() { <-l.slots }()
	now := time.Now()
	live := batch[:0]
	var deadline time.Time
	for _, cl := range batch {
		if !cl.deadline.After(now) {
			cl.reply <- result{err: context.DeadlineExceeded}
			continue
		}
		live = append(live, cl)
		if cl.deadline.After(deadline) {
			deadline = cl.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	pcs := make([]*sluicepb.Check, len(live))
	msgs := make([]sluicepb.Check, len(live))
	for i, cl := range live {
		pcs[i] = toProto(&cl.check, &msgs[i])
	}
	out := make([]result, len(live))
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	c.sendPart(ctx, part{rl: l.rl, routed: l.routed}, pcs, false, out)
	cancel()
	for i, cl := range live {
		cl.reply <- out[i]
	}
}
