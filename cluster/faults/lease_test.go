//go:build linux

package faults

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// leaseEdgePauses are the pauses of the lease-only/pauses-at-the-edge
// row, in leases: just under one, one, just over one, and well over.
var leaseEdgePauses = []float64{0.9, 1.0, 1.1, 1.3}

// pausesAtTheEdge pauses node 2 right after each of four granted lease
// renewals, for 0.9, 1.0, 1.1 and 1.3 leases (L = 2 s), waiting for the
// cluster to be ready between them. Under a pause shorter than the lease
// the node wakes with its lease still running; longer, its lease is over
// and the leader may have ended its epoch and let the others decide its
// keys: at the edge, both may happen in either order, and only the lease
// keeps one decider (with the available policy and one copy).
func pausesAtTheEdge(t *testing.T, c *cluster, tm timing) {
	n := c.node(2)
	const lease = 2 * time.Second
	for _, k := range leaseEdgePauses {
		d := time.Duration(k * float64(lease))
		if err := waitRenewal(n, 3*time.Second); err != nil {
			t.Fatalf("before the pause of %.1f L: %v", k, err)
		}
		if err := n.signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		f := c.beginFault(paused, fmt.Sprintf("n2 paused %.1f L right after a renewal", k), []*node{n}, nil)
		f.checkStopped()
		time.Sleep(d) // not a poll: the pause lasts d
		contNode(t, n, f)
		if err := waitReady(c.running(), time.Now().Add(30*time.Second)); err != nil {
			t.Fatalf("after the pause of %.1f L: %v", k, err)
		}
		time.Sleep(time.Second) // not a poll: the load runs a moment between pauses
	}
}

// waitRenewal returns as soon as n counts one more granted lease renewal
// than when it was called, polling its metrics every few milliseconds.
func waitRenewal(n *node, timeout time.Duration) error {
	first, err := renewalsGranted(n)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(3 * time.Millisecond) { // a poll
		if now, err := renewalsGranted(n); err == nil && now > first {
			return nil
		}
	}
	return fmt.Errorf("%s: no lease renewal granted within %v", n.name, timeout)
}

// renewalsGranted reads sluice_lease_renewals_total{result="granted"}
// from n's /metrics.
func renewalsGranted(n *node) (float64, error) {
	resp, err := n.http.Get("http://127.0.0.1:" + httpPort + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), `sluice_lease_renewals_total{result="granted"} `); ok {
			return strconv.ParseFloat(strings.TrimSpace(line), 64)
		}
	}
	return 0, fmt.Errorf("%s: no granted renewals in its metrics", n.name)
}
