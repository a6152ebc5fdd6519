package node

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// counterValue reads a counter (with the given label value, if any) from a
// node's registry.
func counterValue(t *testing.T, ts *testServer, name, label string) float64 {
	t.Helper()
	mfs, err := ts.srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || hasLabelValue(m, label) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func hasLabelValue(m *dto.Metric, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetValue() == v {
			return true
		}
	}
	return false
}

// TestMeasureHandoff measures how long a handoff of N keys takes when a
// second node joins a node that holds them (about half move):
//
//	SLUICE_MEASURE_HANDOFF=100000 go test ./cmd/sluice/node/ -run MeasureHandoff -v
func TestMeasureHandoff(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_HANDOFF"))
	if n == 0 {
		t.Skip("set SLUICE_MEASURE_HANDOFF=<keys> to measure")
	}
	tc := newTestCluster(t, 1)
	client := tc.client(0)
	for start := 0; start < n; start += 1000 {
		req := &sluicepb.CheckRequest{}
		for k := start; k < min(start+1000, n); k++ {
			req.Checks = append(req.Checks, nativeCheck(fmt.Sprintf("tenant:%d", k), 100, time.Hour, 1))
		}
		if _, err := client.Check(tc.nodes[0].ctx(), req); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	joiner := tc.add()
	tc.waitMembers(2)
	joined := time.Since(began)
	var sent float64
	if err := testkit.Wait(5*time.Minute, func() error {
		sent = counterValue(t, tc.nodes[0], "sluice_handoff_keys_total", "sent")
		received := counterValue(t, joiner, "sluice_handoff_keys_total", "received")
		if sent > 0 && received >= sent {
			return nil
		}
		return fmt.Errorf("handoff incomplete: sent %.0f received %.0f", sent, received)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d keys held; %.0f handed over to the new node in %v (join took %v)", n, sent, time.Since(began).Round(time.Millisecond), joined.Round(time.Millisecond))
}
