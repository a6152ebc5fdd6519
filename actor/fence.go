package actor

import (
	"context"
	"fmt"
	"sync"
)

// Fence moves the engine's ownership generation on and returns the new one.
//
// A node whose set of owned keys changes publishes the new ownership first
// (so that Config.Owner answers it), then calls Fence, then Collect for the
// keys that moved. An actor deciding its part of a fenced call routed at an
// older generation asks Config.Owner about each key of the part, and refuses
// the part (recording nothing) if one is not owned. So every fenced check
// on a moved key is either decided before Collect reads the key, and its
// hits are in what Collect returns, or refused with ErrStale: none is
// decided after Collect. The reason is that each actor decides its calls in
// the order it takes them: a part it decides before taking Collect's call
// is in memory when Collect reads it (or, once evicted, on disk, where
// Collect reads it next), and a part it decides after finds the generation
// moved on, since Fence returned before Collect sent its call.
//
// A reserving call (CallOptions.Marks or AllOrNothing) may release, after
// its decisions, hits that one of its parts reserved on a moved key: when
// another part was refused as stale, or a check was denied. So Collect
// first waits for the fenced reserving calls made at an older generation
// to finish, releases included: a reservation Collect reads is never
// released after. (A reservation that the caller releases later, with
// Release, is its own business: Release is not fenced.)
//
// Calls with no generation (Check, CheckAll, CheckMarked, Do with
// CallOptions.Generation 0), Release and Import are not fenced.
func (e *Engine) Fence() uint64 { return e.gen.Add(1) }

// Generation returns the engine's ownership generation, for
// CallOptions.Generation. It is never 0. A caller reads it before it looks
// up the owner of the call's keys.
func (e *Engine) Generation() uint64 { return e.gen.Load() }

// StaleError is the error of a fenced call that was refused as stale by
// some of the actors holding its keys and decided by the others. It
// matches ErrStalePartial and ErrStale.
type StaleError struct {
	// Refused holds the indexes of the checks that were refused: nothing
	// was recorded for them, and their decisions are zero. The other
	// checks were decided, and their hits recorded.
	Refused []int
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("%v (%d checks refused)", ErrStalePartial, len(e.Refused))
}

// Unwrap returns ErrStalePartial and ErrStale.
func (e *StaleError) Unwrap() []error { return []error{ErrStalePartial, ErrStale} }

// unreserve takes back what the decided parts of a reserving call recorded
// once another part was refused as stale, so that the call can be routed
// again. It returns ErrStale if nothing of the call stays recorded, or se
// if a refund or a penalty of a decided part was applied: those cannot be
// taken back. The decisions of the released checks say denied, as after
// Unwind.
func (e *Engine) unreserve(ctx context.Context, checks []Check, out []Decision, marks []int64, se *StaleError) error {
	refused := make([]bool, len(checks))
	for _, i := range se.Refused {
		refused[i] = true
	}
	var release []Check
	var releaseMarks []int64
	kept := false
	for i := range checks {
		c := &checks[i]
		switch {
		case refused[i] || c.Cost == 0:
		case c.Refund:
			kept = true
		case out[i].Allowed:
			release = append(release, *c)
			releaseMarks = append(releaseMarks, marks[i])
			out[i].Allowed = false
			out[i].Remaining = min(out[i].Limit, out[i].Remaining+c.Cost)
		case c.Penalty:
			kept = true
		}
	}
	if err := e.Release(ctx, release, releaseMarks); err != nil {
		return fmt.Errorf("%w; releasing what the other parts reserved failed too: %v", se, err)
	}
	if kept {
		return se
	}
	return ErrStale
}

// unreserveFull takes back the hits the decided parts of a call recorded
// once another part was refused for the key bound (memory mode), and
// returns ErrTooManyKeys. Refunds and penalties of the decided parts stay:
// they cannot be taken back.
func (e *Engine) unreserveFull(ctx context.Context, checks []Check, out []Decision, marks []int64) error {
	var release []Check
	var releaseMarks []int64
	for i := range checks {
		if c := &checks[i]; c.Cost > 0 && !c.Refund && out[i].Allowed {
			release = append(release, *c)
			releaseMarks = append(releaseMarks, marks[i])
			out[i].Allowed = false
		}
	}
	if err := e.Release(ctx, release, releaseMarks); err != nil {
		return fmt.Errorf("%w; releasing what the other parts recorded failed too: %v", ErrTooManyKeys, err)
	}
	return ErrTooManyKeys
}

// doReserving is Do for a fenced reserving call: Collect waits for it (see
// Fence).
func (e *Engine) doReserving(ctx context.Context, checks []Check, out []Decision, opt CallOptions) error {
	e.reserving.enter(opt.Generation)
	defer e.reserving.leave(opt.Generation)
	return e.do(ctx, checks, out, opt)
}

// reservations counts the fenced reserving calls in flight by the
// generation they were made at, so that Collect can wait for those made
// before a Fence. The zero value is ready.
type reservations struct {
	mu    sync.Mutex
	byGen map[uint64]int
	// left is closed, and replaced, whenever the last call of a generation
	// finishes.
	left chan struct{}
}

func (r *reservations) enter(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byGen == nil {
		r.byGen = make(map[uint64]int)
	}
	r.byGen[gen]++
}

func (r *reservations) leave(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byGen[gen]--; r.byGen[gen] > 0 {
		return
	}
	delete(r.byGen, gen)
	if r.left != nil {
		close(r.left)
		r.left = nil
	}
}

// wait returns once no call made at a generation before gen is in flight.
func (r *reservations) wait(ctx context.Context, gen uint64) error {
	for {
		r.mu.Lock()
		busy := false
		for g := range r.byGen {
			busy = busy || g < gen
		}
		if !busy {
			r.mu.Unlock()
			return nil
		}
		if r.left == nil {
			r.left = make(chan struct{})
		}
		left := r.left
		r.mu.Unlock()
		select {
		case <-left:
		case <-ctx.Done():
			return fmt.Errorf("actor: wait for reserving calls: %w", ctx.Err())
		}
	}
}

// owns reports whether the engine still owns every key of this actor's
// part of c (Config.Owner).
func (a *actor) owns(c *call) bool {
	owner := a.e.cfg.Owner
	if owner == nil {
		return true
	}
	for i := range c.checks {
		if c.shards[i] == a.id && !owner.Decidable(c.checks[i].Key) {
			return false
		}
	}
	return true
}

// refuse refuses this actor's part of c as stale: it records nothing and
// leaves zero decisions.
func (a *actor) refuse(c *call) {
	for i := range c.checks {
		if c.shards[i] == a.id {
			c.out[i] = Decision{}
		}
	}
	if int(a.id) < len(c.staleParts) {
		c.staleParts[a.id] = true
	}
	c.refused.Add(1)
}
