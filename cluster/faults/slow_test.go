//go:build linux

package faults

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// replicaTimeout is the nodes' --replica-timeout (their default): how long
// an owner waits for a standby to confirm a write.
const replicaTimeout = 500 * time.Millisecond

// linkShape is a token bucket filter for both ends of a link: a rate
// below what the load sends, and a queue.
type linkShape struct {
	// rate is tc's rate ("160kbit").
	rate string
	// queue is tc's bound of the queue: "latency 400ms" holds a packet up
	// to that long, "limit 3000" up to that many bytes.
	queue []string
	// lossy requires the queues to have dropped packets.
	lossy bool
}

// The kernel here has no netem, so latency and loss come from a real
// queue rather than from a fixed delay and a random drop: they grow with
// what the link carries, as on a congested link. The load sends more than
// 20 kB/s over node 2's link either way.
var (
	// slowShape holds each packet up to 400 ms: with the packets ahead of
	// it and TCP's retransmissions, a call that crosses the link waits
	// about the replica timeout. TCP slows its senders to the link's
	// rate, so the queue seldom overflows: a slow link, not a lossy one.
	slowShape = linkShape{rate: "160kbit", queue: []string{"latency", "400ms"}}
	// lossyShape queues two packets at most and drops the rest (a few in
	// a hundred under the load): TCP's retransmissions after a drop wait
	// 200 ms or more.
	lossyShape = linkShape{rate: "160kbit", queue: []string{"limit", "3000"}, lossy: true}
)

// String describes s for the table.
func (s linkShape) String() string {
	if s.lossy {
		return fmt.Sprintf("shaped to %s each way, a queue of %s bytes, packets beyond it dropped", s.rate, s.queue[1])
	}
	return fmt.Sprintf("shaped to %s each way, packets held up to %s", s.rate, s.queue[1])
}

// slowLink shapes node 2's link with slowShape for the fault's length.
func slowLink(t *testing.T, c *cluster, tm timing) { shapeLink(t, c, tm, slowShape) }

// lossyLink shapes node 2's link with lossyShape for the fault's length.
func lossyLink(t *testing.T, c *cluster, tm timing) { shapeLink(t, c, tm, lossyShape) }

// shapeLink shapes node 2's link both ways for the fault's length.
// Calls, copies and lease renewals that cross it wait near the replica
// timeout, some beyond it; nothing is cut, so whether gossip or the map
// call node 2 down is up to the cluster. The row notes what the queues
// did and how often node 2's epoch ended.
func shapeLink(t *testing.T, c *cluster, tm timing, s linkShape) {
	n := c.node(2)
	ended := len(n.logLines("this node's epoch ended"))
	if err := n.host.shape(&s); err != nil {
		t.Fatal(err)
	}
	f := c.beginFault(slowed, n.name+"'s link shaped", []*node{n}, c.others(n))
	time.Sleep(tm.fault) // not a poll: the fault lasts this long
	stats, err := n.host.shapeStats()
	if err != nil {
		f.problem("read the link's queue statistics: %v", err)
	} else {
		f.note("its queues sent %d packets and dropped %d", stats.sent, stats.dropped)
		if s.lossy && stats.dropped == 0 {
			f.problem("its queues dropped no packet: the load did not fill them")
		}
	}
	if err := n.host.shape(nil); err != nil {
		t.Fatal(err)
	}
	f.heal()
	f.note("%s's epoch ended %d times", n.name, len(n.logLines("this node's epoch ended"))-ended)
}

// shape adds s (or with s nil, removes the filter) on both ends of h's
// link: what h sends and what it receives.
func (h *host) shape(s *linkShape) error {
	var errs []string
	for _, end := range [][2]string{{h.ns, h.ifname}, {h.sw, h.port}} {
		args := []string{"-n", end[0], "qdisc", "del", "dev", end[1], "root"}
		if s != nil {
			args = append([]string{"-n", end[0], "qdisc", "add", "dev", end[1], "root", "tbf",
				"rate", s.rate, "burst", "4kb"}, s.queue...)
		}
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Sprintf("tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
	if errs != nil {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// queueStats are what a link's two token bucket filters did.
type queueStats struct{ sent, dropped int }

// tcSent matches tc's statistics line: "Sent 1234 bytes 56 pkt (dropped 7, ...".
var tcSent = regexp.MustCompile(`Sent \d+ bytes (\d+) pkt \(dropped (\d+),`)

// shapeStats sums the statistics of both ends' filters.
func (h *host) shapeStats() (queueStats, error) {
	var st queueStats
	for _, end := range [][2]string{{h.ns, h.ifname}, {h.sw, h.port}} {
		out, err := exec.Command("tc", "-n", end[0], "-s", "qdisc", "show", "dev", end[1]).CombinedOutput()
		if err != nil {
			return st, fmt.Errorf("tc -s qdisc show dev %s: %v: %s", end[1], err, out)
		}
		m := tcSent.FindSubmatch(out)
		if m == nil {
			return st, fmt.Errorf("tc -s qdisc show dev %s: no statistics in %q", end[1], out)
		}
		sent, _ := strconv.Atoi(string(m[1]))
		dropped, _ := strconv.Atoi(string(m[2]))
		st.sent += sent
		st.dropped += dropped
	}
	return st, nil
}

// slowCalls counts the calls sent while f lasted that took at least
// 0.8 of the replica timeout to be answered or to fail, and how many of
// those were answered: the proof that a slowed link slowed what crossed
// it.
func (f *fault) slowCalls(calls []call) (slow, answered int) {
	for i := range calls {
		cl := &calls[i]
		if cl.sent.Before(f.start) || !cl.sent.Before(f.end) {
			continue
		}
		if cl.replied.Sub(cl.sent) >= replicaTimeout*8/10 {
			slow++
			if cl.outcome != failed {
				answered++
			}
		}
	}
	return slow, answered
}
