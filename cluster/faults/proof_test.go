//go:build linux

package faults

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// faultKind is what a fault does to its victims.
type faultKind uint8

const (
	// cutOff: the victims' links are down or blackholed, their own clients
	// still reach them over loopback.
	cutOff faultKind = iota
	// paused: the victims are stopped with SIGSTOP.
	paused
	// killed: the victims are killed with SIGKILL.
	killed
	// restarted: the victims are stopped with SIGTERM and started again.
	restarted
	// gossipBlind: the victims' second address, where the peer service
	// listens, is cut one way; gossip, on the first, still works.
	gossipBlind
	// refused: the victims must refuse to join and exit.
	refused
	// gossipCut: the victims' gossip is cut both ways, Raft and the peer
	// service still flow: the observers must see them down in gossip.
	gossipCut
	// slowed: the victims' links are shaped (slowLink): calls that cross
	// them must have waited near the replica timeout, and packets must
	// have been dropped. Whether anyone sees the victims down is up to
	// the cluster.
	slowed
)

// fault is one fault a scenario injected: what it did to which nodes and
// when, and what the harness saw of it. A row fails unless its faults were
// seen (verify).
type fault struct {
	kind    faultKind
	what    string  // "n2 cut off"
	victims []*node // the nodes it hits
	// observers are nodes the fault leaves alone: they must see the
	// victims down (or, gossipBlind, keep seeing them alive).
	observers  []*node
	start, end time.Time

	stop, done chan struct{}
	healOnce   sync.Once
	mu         sync.Mutex
	// seen[observer][victim] counts the polls in which the observer listed
	// the victim other than alive; answered[observer] its answered polls.
	// For a cut, victims are polled too, about the observers.
	seen     map[string]map[string]int
	answered map[string]int
	// stopped notes, per paused victim, whether its process was seen
	// stopped (state T in /proc).
	stopped map[string]bool
	// notes are what the injection saw itself (exit statuses, answers).
	notes []string
	// problems are what it saw go wrong, reported by verify.
	problems []string
	// mustDecide are nodes that must have decided (allowed or denied) some
	// call sent while the fault lasted: the row is about them.
	mustDecide []string
	// mustTakeOver requires another node to have decided, while the fault
	// lasted, some key each victim decided before it.
	mustTakeOver bool
}

// beginFault records that a fault of kind starts now on victims, and
// starts polling the observers' member lists (and, for a cut, the
// victims') every 200 ms until heal.
func (c *cluster) beginFault(kind faultKind, what string, victims, observers []*node) *fault {
	f := &fault{
		kind: kind, what: what, victims: victims, observers: observers, start: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{}),
		seen: map[string]map[string]int{}, answered: map[string]int{}, stopped: map[string]bool{},
	}
	c.mu.Lock()
	c.faults = append(c.faults, f)
	c.mu.Unlock()
	go f.monitor()
	return f
}

// monitor polls the member lists until stop.
func (f *fault) monitor() {
	defer close(f.done)
	type poll struct {
		asker *node
		about []*node
	}
	polls := []poll{}
	for _, o := range f.observers {
		polls = append(polls, poll{o, f.victims})
	}
	if f.kind == cutOff {
		for _, v := range f.victims {
			polls = append(polls, poll{v, f.observers})
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var wg sync.WaitGroup
		for _, p := range polls {
			wg.Go(func() {
				states, err := p.asker.members(700 * time.Millisecond)
				if err != nil {
					return
				}
				f.mu.Lock()
				defer f.mu.Unlock()
				f.answered[p.asker.name]++
				if f.seen[p.asker.name] == nil {
					f.seen[p.asker.name] = map[string]int{}
				}
				for _, v := range p.about {
					// A cut of the peer address alone must not show in
					// gossip (the map may well end the victim's epoch:
					// its renewals stop); every other fault must show as
					// the victim not alive, in gossip or in the map.
					down := states[v.name].state != "alive"
					if f.kind == gossipBlind || f.kind == gossipCut {
						down = states[v.name].gossip != "alive"
					}
					if down {
						f.seen[p.asker.name][v.name]++
					}
				}
			})
		}
		wg.Wait()
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
	}
}

// note records what the injection saw.
func (f *fault) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// problem records what went wrong with the fault itself.
func (f *fault) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

// checkStopped notes whether each victim's process is stopped (state T in
// /proc/PID/stat), as SIGSTOP leaves it. It polls up to a second.
func (f *fault) checkStopped() {
	for _, v := range f.victims {
		if testkit.Wait(time.Second, func() error {
			if state := processState(v.cmd.Process.Pid); state != "T" {
				return fmt.Errorf("%s in state %q", v.name, state)
			}
			return nil
		}) == nil {
			f.mu.Lock()
			f.stopped[v.name] = true
			f.mu.Unlock()
		}
	}
}

// processState returns the state letter of process pid ("R", "S", "T"...),
// or "" if it cannot be read.
func processState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// heal records the fault's end and stops the monitor. Only the first
// call counts.
func (f *fault) heal() {
	f.healOnce.Do(func() {
		f.mu.Lock()
		f.end = time.Now()
		f.mu.Unlock()
		close(f.stop)
		<-f.done
	})
}

// stopMonitors stops the monitors of faults a failed scenario left
// unhealed; their end stays unset.
func (c *cluster) stopMonitors() {
	c.mu.Lock()
	faults := slices.Clone(c.faults)
	c.mu.Unlock()
	for _, f := range faults {
		f.healOnce.Do(func() {
			close(f.stop)
			<-f.done
		})
	}
}

// verify says what the fault was seen to do, and what shows it did not
// happen as meant, from the polls and from calls, every call of the
// scenario: indexes into the cluster's nodes are client numbers.
func (f *fault) verify(c *cluster, calls []call) (seen string, errs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs = append(errs, f.problems...)
	if f.end.IsZero() {
		errs = append(errs, f.what+": never healed")
		return f.what, errs
	}
	var parts []string
	clientOf := func(n *node) int { return slices.Index(c.nodes, n) }
	inFault := func(t time.Time) bool { return !t.Before(f.start) && !t.After(f.end) }
	names := func(ns []*node) string {
		var out []string
		for _, n := range ns {
			out = append(out, n.name)
		}
		return strings.Join(out, ", ")
	}
	// sawDown: the observers that answered saw every victim down at least
	// once; with want false (gossipBlind), never. Observers that are not
	// a majority of the nodes are only reported: memberlist confirms a
	// failure through other members (indirect probes) and, failing that,
	// a lone node slows its own detection down (Lifeguard), so it may
	// still list the victim alive when the fault ends.
	sawDown := func(want bool) {
		if len(f.observers) == 0 {
			return // the fault names nobody who must see it
		}
		if want && 2*len(f.observers) <= len(c.nodes) {
			var saw, not []string
			for _, o := range f.observers {
				for _, v := range f.victims {
					if f.seen[o.name][v.name] > 0 {
						saw = append(saw, o.name)
					} else {
						not = append(not, o.name)
					}
				}
			}
			switch {
			case len(not) == 0:
				parts = append(parts, fmt.Sprintf("%s saw it down", strings.Join(saw, ", ")))
			default:
				parts = append(parts, fmt.Sprintf("%s, a minority, still listed it alive", strings.Join(not, ", ")))
			}
			return
		}
		answered, wrong := 0, 0
		for _, o := range f.observers {
			if f.answered[o.name] == 0 {
				continue
			}
			answered++
			for _, v := range f.victims {
				n := f.seen[o.name][v.name]
				switch {
				case want && n == 0:
					wrong++
					errs = append(errs, fmt.Sprintf("%s: %s listed %s alive in all %d of its answers while the fault lasted; want suspect or dead", f.what, o.name, v.name, f.answered[o.name]))
				case !want && n > 0:
					wrong++
					errs = append(errs, fmt.Sprintf("%s: %s listed %s down in %d of its %d answers; a cut of the peer address alone must not show in gossip", f.what, o.name, v.name, n, f.answered[o.name]))
				}
			}
		}
		if answered == 0 && len(f.observers) > 0 {
			errs = append(errs, fmt.Sprintf("%s: none of %s answered ListMembers while the fault lasted", f.what, names(f.observers)))
			return
		}
		if len(f.observers) > 0 && wrong == 0 {
			if want {
				parts = append(parts, fmt.Sprintf("%s saw it down", names(f.observers)))
			} else {
				parts = append(parts, fmt.Sprintf("%s kept it alive in gossip", names(f.observers)))
			}
		}
	}
	for _, name := range f.mustDecide {
		decided := 0
		for i := range calls {
			if calls[i].outcome != failed && calls[i].node == name && inFault(calls[i].sent) {
				decided++
			}
		}
		if decided == 0 {
			errs = append(errs, fmt.Sprintf("%s: %s decided none of the calls sent while the fault lasted", f.what, name))
		} else {
			parts = append(parts, fmt.Sprintf("%s decided %d calls", name, decided))
		}
	}
	if f.mustTakeOver {
		for _, v := range f.victims {
			before, taken := map[int]bool{}, map[int]bool{}
			for i := range calls {
				cl := &calls[i]
				switch {
				case cl.outcome == failed:
				case cl.node == v.name && cl.replied.Before(f.start):
					before[cl.key] = true
				case cl.node != v.name && inFault(cl.sent):
					taken[cl.key] = true
				}
			}
			n := 0
			for k := range before {
				if taken[k] {
					n++
				}
			}
			if n == 0 {
				errs = append(errs, fmt.Sprintf("%s: no other node decided any of the %d keys %s decided before the fault while it lasted", f.what, len(before), v.name))
			} else {
				parts = append(parts, fmt.Sprintf("%d of the %d keys %s decided taken over", n, len(before), v.name))
			}
		}
	}
	switch f.kind {
	case cutOff:
		for _, v := range f.victims {
			refused := 0
			for i := range calls {
				if calls[i].client == clientOf(v) && calls[i].outcome == failed && inFault(calls[i].sent) {
					refused++
				}
			}
			sawOthers := 0
			for _, o := range f.observers {
				if f.seen[v.name][o.name] > 0 {
					sawOthers++
				}
			}
			switch {
			case refused > 0:
				parts = append(parts, fmt.Sprintf("%s's client refused %d calls", v.name, refused))
			case sawOthers > 0:
				// The fault happened (the victim lost the others); that its
				// client was served anyway is a finding of the row, not a
				// fault that did not happen.
				parts = append(parts, fmt.Sprintf("%s saw the others down and its client was never refused", v.name))
			default:
				errs = append(errs, fmt.Sprintf("%s: %s's client got no refusal and %s never saw the others down while the fault lasted", f.what, v.name, v.name))
			}
		}
		sawDown(true)
	case paused:
		for _, v := range f.victims {
			if !f.stopped[v.name] {
				errs = append(errs, fmt.Sprintf("%s: %s's process was never seen stopped", f.what, v.name))
			}
			// No answer while it was stopped: allow a moment after the
			// signal for a reply already on its way.
			answered, tried := 0, 0
			for i := range calls {
				cl := &calls[i]
				if cl.client != clientOf(v) {
					continue
				}
				if inFault(cl.sent) {
					tried++
				}
				// A call sent once the process was stopped cannot be
				// answered before it continues. (Judged by when a call was
				// sent, not when its answer was noted: on a loaded machine
				// the client may note an answer the node sent before it
				// stopped well after the stop.)
				if cl.outcome != failed && cl.sent.After(f.start.Add(100*time.Millisecond)) && cl.replied.Before(f.end) {
					answered++
				}
			}
			if answered > 0 || tried == 0 {
				errs = append(errs, fmt.Sprintf("%s: %s's client got %d answers from it while it was stopped, of %d calls sent; want none, and some sent", f.what, v.name, answered, tried))
			} else {
				parts = append(parts, fmt.Sprintf("%s stopped, its client unanswered", v.name))
			}
		}
		sawDown(true)
	case killed, restarted:
		sawDown(f.kind == killed)
	case gossipCut:
		sawDown(true)
	case slowed:
		slow, answered := f.slowCalls(calls)
		if slow == 0 {
			errs = append(errs, fmt.Sprintf("%s: no call sent while it lasted took %s or more; want the link to slow calls to near the replica timeout", f.what, replicaTimeout*8/10))
		} else {
			parts = append(parts, fmt.Sprintf("%d calls took %s or more (%d of them answered)", slow, replicaTimeout*8/10, answered))
		}
	case refused:
		// The refused node never became a member: what the others list
		// of it says nothing; the scenario checks its exit and its line.
	case gossipBlind:
		failedCalls := 0
		for i := range calls {
			cl := &calls[i]
			if cl.outcome == failed && inFault(cl.sent) && slices.ContainsFunc(f.observers, func(o *node) bool { return clientOf(o) == cl.client }) {
				failedCalls++
			}
		}
		if failedCalls == 0 {
			errs = append(errs, fmt.Sprintf("%s: the clients of %s got no failed call while the fault lasted; want the calls they forward to %s to fail", f.what, names(f.observers), names(f.victims)))
		} else {
			parts = append(parts, fmt.Sprintf("the clients of %s got %d failed calls", names(f.observers), failedCalls))
		}
		sawDown(false)
	}
	parts = append(parts, f.notes...)
	return f.what + ": " + strings.Join(parts, ", "), errs
}

// verifyFaults fails the test for every fault of the scenario that was
// not seen to happen, and returns what each was seen to do.
func (c *cluster) verifyFaults(t *testing.T, calls []call) []string {
	t.Helper()
	c.mu.Lock()
	faults := slices.Clone(c.faults)
	c.mu.Unlock()
	if len(faults) == 0 {
		t.Errorf("the scenario injected no fault")
	}
	var seen []string
	for _, f := range faults {
		s, errs := f.verify(c, calls)
		seen = append(seen, s)
		for _, e := range errs {
			t.Errorf("fault not seen: %s", e)
		}
	}
	return seen
}
