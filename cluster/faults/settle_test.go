//go:build linux

package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// peek is what the cluster says about a key through one node.
type peek struct {
	used int64  // limit - remaining
	node string // the node that answered for the key (its acting member)
}

// peekAll peeks at every key through every node of nodes:
// peeks[key][node]. It fails if any node fails to answer for any key.
func peekAll(nodes []*node, keys []testKey) ([][]peek, error) {
	req := &sluicepb.CheckRequest{}
	for _, k := range keys {
		req.Checks = append(req.Checks, k.check(0))
	}
	peeks := make([][]peek, len(keys))
	for i := range peeks {
		peeks[i] = make([]peek, len(nodes))
	}
	for j, n := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := n.limit.Check(ctx, req)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("peek through %s: %v", n.name, err)
		}
		if len(resp.Decisions) != len(keys) {
			return nil, fmt.Errorf("peek through %s: %d decisions for %d checks", n.name, len(resp.Decisions), len(keys))
		}
		for i, d := range resp.Decisions {
			peeks[i][j] = peek{used: keys[i].limit - d.Remaining, node: d.Node}
		}
	}
	return peeks, nil
}

// disagreement returns an error naming the first key that the nodes count
// differently, or say another node decides.
func disagreement(nodes []*node, keys []testKey, peeks [][]peek) error {
	for i, p := range peeks {
		for _, q := range p[1:] {
			if q != p[0] {
				return fmt.Errorf("%s: %s", keys[i].name, describePeeks(nodes, p))
			}
		}
	}
	return nil
}

// describePeeks says what each node answered for one key.
func describePeeks(nodes []*node, p []peek) string {
	var parts []string
	for j, q := range p {
		parts = append(parts, fmt.Sprintf("through %s: %d used on %s", nodes[j].name, q.used, q.node))
	}
	return strings.Join(parts, ", ")
}

// localRead is what one node holds of a key itself: its own state and its
// standby copy (GetKey with local).
type localRead struct {
	state, replica *sluicepb.KeyState
}

// readLocal reads what n holds of every key, in order.
func (n *node) readLocal(keys []testKey) ([]localRead, error) {
	out := make([]localRead, len(keys))
	for i, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := n.admin.GetKey(ctx, &sluicepb.GetKeyRequest{Key: []byte(k.name), Local: true})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("local read of %s on %s: %v", k.name, n.name, err)
		}
		if resp.State == nil || resp.Replica == nil {
			return nil, fmt.Errorf("local read of %s on %s: state %v, replica %v; want both (a node without GetKeyRequest.local?)", k.name, n.name, resp.State, resp.Replica)
		}
		out[i] = localRead{resp.State, resp.Replica}
	}
	return out, nil
}

// owners returns the members n lists with a live epoch in phase joined:
// the nodes among which a key's acting member and standby are ranked.
func (n *node) owners() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range resp.Members {
		if m.Live && m.Phase == "joined" {
			out = append(out, m.Name)
		}
	}
	return out, nil
}

// standbyOf returns the standby of key acted for by acting: the first
// owner after acting in the key's rendezvous order, "" if none.
func standbyOf(key, acting string, owners []string) string {
	order := rendezvous(key, owners)
	i := slices.Index(order, acting)
	if i < 0 || i+1 >= len(order) {
		return ""
	}
	return order[i+1]
}

// settled is what the nodes hold once the cluster has settled.
type settled struct {
	// copies holds, by key, the copies that must agree: the acting node's
	// own state, then its standby's copy (with replicas 2 and a standby).
	copies [][]keyCopy
	// withStandby counts the keys with a standby copy compared.
	withStandby int
	// strays lists states and copies held by other nodes, for the log.
	strays []string
}

// settle waits until the cluster has recovered from a fault: every node of
// nodes ready, seeing every other alive; two peeks in a row at every key
// through every node giving the same count and deciding node; and every
// copy of every key agreeing: the acting node's own state counts what the
// peeks say and, with replicas 2, the standby's copy counts the same. It
// returns the copies it read last, and an error if the cluster did not
// settle by deadline.
func settle(nodes []*node, keys []testKey, replicas int, deadline time.Time) (settled, error) {
	var last settled
	for _, n := range nodes {
		if err := n.waitReady(deadline); err != nil {
			return last, err
		}
	}
	if err := waitMembers(nodes, deadline); err != nil {
		return last, err
	}
	var prev [][]peek
	for {
		st, peeks, err := readCopies(nodes, keys, replicas)
		if st.copies != nil {
			last = st
		}
		if err == nil && slices.EqualFunc(peeks, prev, slices.Equal[[]peek]) {
			return st, nil
		}
		prev = peeks
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("the peeks still change")
			}
			return last, fmt.Errorf("cluster not settled: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // not a poll: settled means two peeks 200 ms apart agree
	}
}

// readCopies peeks at every key through every node and reads the copies
// of every key on its acting node and standby; it returns an error if the
// peeks or the copies disagree.
func readCopies(nodes []*node, keys []testKey, replicas int) (settled, [][]peek, error) {
	var st settled
	peeks, err := peekAll(nodes, keys)
	if err != nil {
		return st, nil, err
	}
	if err := disagreement(nodes, keys, peeks); err != nil {
		return st, peeks, err
	}
	owners, err := nodes[0].owners()
	if err != nil {
		return st, peeks, fmt.Errorf("list members on %s: %v", nodes[0].name, err)
	}
	reads := make(map[string][]localRead, len(nodes))
	errs := make([]error, len(nodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for j, n := range nodes {
		wg.Go(func() {
			r, err := n.readLocal(keys)
			mu.Lock()
			defer mu.Unlock()
			reads[n.name], errs[j] = r, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return st, peeks, err
		}
	}
	st.copies = make([][]keyCopy, len(keys))
	var bad []string
	for i, k := range keys {
		acting := peeks[i][0].node
		own, ok := reads[acting]
		if !ok {
			return st, peeks, fmt.Errorf("%s: decided by %s, not one of the nodes read", k.name, acting)
		}
		state := own[i].state
		st.copies[i] = append(st.copies[i], keyCopy{what: acting + "'s state", used: state.GetUsed(), runs: runsOf(state)})
		// A peek's count is limit - remaining, at most the limit; a log
		// may hold one hit more.
		if min(state.GetUsed(), k.limit) != peeks[i][0].used {
			bad = append(bad, fmt.Sprintf("%s: %s's own state counts %d, its peek %d", k.name, acting, state.GetUsed(), peeks[i][0].used))
		}
		standby := ""
		if replicas >= 2 {
			standby = standbyOf(k.name, acting, owners)
		}
		if standby != "" {
			sb, ok := reads[standby]
			if !ok {
				return st, peeks, fmt.Errorf("%s: standby %s is not one of the nodes read", k.name, standby)
			}
			rep := sb[i].replica
			st.copies[i] = append(st.copies[i], keyCopy{what: standby + "'s standby copy", used: rep.GetUsed(), runs: runsOf(rep)})
			st.withStandby++
			if rep.GetFound() != state.GetFound() || rep.GetUsed() != state.GetUsed() {
				bad = append(bad, fmt.Sprintf("%s: %s's standby copy counts %d (found %v), %s's state %d (found %v)",
					k.name, standby, rep.GetUsed(), rep.GetFound(), acting, state.GetUsed(), state.GetFound()))
			}
		}
		for _, n := range nodes {
			r := reads[n.name][i]
			if n.name != acting && r.state.GetFound() {
				st.strays = append(st.strays, fmt.Sprintf("%s holds a state of %s (%d used), which %s decides", n.name, k.name, r.state.GetUsed(), acting))
			}
			if n.name != standby && r.replica.GetFound() {
				st.strays = append(st.strays, fmt.Sprintf("%s holds a standby copy of %s (%d used); its standby is %q", n.name, k.name, r.replica.GetUsed(), standby))
			}
		}
	}
	if len(bad) > 0 {
		return st, peeks, fmt.Errorf("copies disagree: %s", strings.Join(bad, "; "))
	}
	return st, peeks, nil
}
