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

// batchLoop gathers the checks of concurrent Check calls into calls to
// Sluice: it takes a call slot (at most MaxInFlight calls in flight), then
// every check queued meanwhile, up to MaxBatch, waiting up to BatchWait
// for more if the batch is not full, and sends them in one call on a
// goroutine of their own. Under load, checks queue while the slots are
// busy and batches grow; an idle client sends each check at once.
func (c *Client) batchLoop() {
	defer c.wg.Done()
	var timer *time.Timer
	if c.cfg.BatchWait > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
	}
	for {
		var first *call
		select {
		case first = <-c.queue:
		case <-c.done:
			c.drain()
			return
		}
		select {
		case c.slots <- struct{}{}:
		case <-c.done:
			first.reply <- result{err: ErrClosed}
			c.drain()
			return
		}
		batch := make([]*call, 1, min(c.cfg.MaxBatch, 1+len(c.queue)))
		batch[0] = first
	drain:
		for len(batch) < c.cfg.MaxBatch {
			select {
			case cl := <-c.queue:
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
				case cl := <-c.queue:
					batch = append(batch, cl)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		c.wg.Add(1)
		go c.send(batch)
	}
}

// drain fails the calls still queued when the client closes.
func (c *Client) drain() {
	for {
		select {
		case cl := <-c.queue:
			cl.reply <- result{err: ErrClosed}
		default:
			return
		}
	}
}

// send makes one call of the batch's checks, under the latest of their
// deadlines (each caller stops waiting at its own), and answers each.
// Calls whose deadline already passed are left out.
func (c *Client) send(batch []*call) {
	defer c.wg.Done()
	defer func() { <-c.slots }()
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
	c.sendParts(ctx, pcs, func(i int) string { return live[i].check.Key }, false, out)
	cancel()
	for i, cl := range live {
		cl.reply <- out[i]
	}
}
