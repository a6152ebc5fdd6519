package client

import (
	"context"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// call is checks waiting for their decisions: one Check's, or the part
// of a CheckEach for one node, which stays in one call to it.
type call struct {
	checks   []Check
	deadline time.Time
	reply    chan []result // capacity 1: the sender never blocks
}

// fail answers every check of cl with err.
func (cl *call) fail(err error) {
	out := make([]result, len(cl.checks))
	for i := range out {
		out[i].err = err
	}
	cl.reply <- out
}

// result is the answer to a check: Sluice's decision, or the error of the
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

// batchLoop gathers the checks of concurrent Check and CheckEach calls
// queued on l into calls to l's node: it takes a call slot (at most
// MaxInFlight calls in flight), then every check queued meanwhile, up to
// MaxBatch (a CheckEach part that would not fit waits for the next call,
// unless it is alone), waiting up to BatchWait for more if the batch is
// not full, and sends them in one call on a goroutine of their own. Under
// load, checks queue while the slots are busy and batches grow; an idle
// client sends each check at once. It returns when the client closes, or
// when l retires (its queued checks then go to the seed lane).
func (c *Client) batchLoop(l *lane) {
	defer c.wg.Done()
	var timer *time.Timer
	if c.cfg.BatchWait > 0 {
		timer = time.NewTimer(time.Hour)
		timer.Stop()
	}
	var next *call // taken from the queue, too large for the last batch
	for {
		first := next
		next = nil
		if first == nil {
			select {
			case first = <-l.queue:
			case <-c.done:
				c.drain(l)
				return
			case <-l.stop:
				c.handOver(l)
				return
			}
		}
		select {
		case l.slots <- struct{}{}:
		case <-c.done:
			first.fail(ErrClosed)
			c.drain(l)
			return
		}
		batch := make([]*call, 1, min(c.cfg.MaxBatch, 1+len(l.queue)))
		batch[0] = first
		n := len(first.checks)
		add := func(cl *call) bool {
			if n+len(cl.checks) > c.cfg.MaxBatch {
				next = cl
				return false
			}
			batch = append(batch, cl)
			n += len(cl.checks)
			return true
		}
	drain:
		for n < c.cfg.MaxBatch {
			select {
			case cl := <-l.queue:
				if !add(cl) {
					break drain
				}
			default:
				break drain
			}
		}
		if timer != nil && n < c.cfg.MaxBatch && next == nil {
			timer.Reset(c.cfg.BatchWait)
		wait:
			for n < c.cfg.MaxBatch {
				select {
				case cl := <-l.queue:
					if !add(cl) {
						break wait
					}
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		c.wg.Add(1)
		go c.send(l, batch, n)
	}
}

// drain fails the calls still queued on l when the client closes.
func (c *Client) drain(l *lane) {
	for {
		select {
		case cl := <-l.queue:
			cl.fail(ErrClosed)
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
				cl.fail(ErrClosed)
			}
		default:
			return
		}
	}
}

// send makes one call to l's node of the batch's n checks, under the
// latest of their deadlines (each caller stops waiting at its own), and
// answers each. Calls whose deadline already passed are left out.
func (c *Client) send(l *lane, batch []*call, n int) {
	defer c.wg.Done()
	defer func() { <-l.slots }()
	now := time.Now()
	live := batch[:0]
	var deadline time.Time
	for _, cl := range batch {
		if !cl.deadline.After(now) {
			cl.fail(context.DeadlineExceeded)
			n -= len(cl.checks)
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
	pcs := make([]*sluicepb.Check, 0, n)
	msgs := make([]sluicepb.Check, n)
	for _, cl := range live {
		for i := range cl.checks {
			pcs = append(pcs, toProto(&cl.checks[i], &msgs[len(pcs)]))
		}
	}
	out := make([]result, n)
	ctx, cancel := context.WithDeadline(c.ctx, deadline)
	c.sendPart(ctx, l, pcs, false, out)
	cancel()
	off := 0
	for _, cl := range live {
		cl.reply <- out[off : off+len(cl.checks) : off+len(cl.checks)]
		off += len(cl.checks)
	}
}
