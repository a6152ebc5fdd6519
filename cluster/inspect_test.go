package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestChanges: a node remembers the changes of the live members it saw,
// oldest first, each with the epoch of the view it made: its own joining,
// the others joining, and one leaving.
func TestChanges(t *testing.T) {
	nodes := startCluster(t, 3)
	if err := nodes[2].Leave(2 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	waitMembers(t, 5*time.Second, nodes[:2], 2)
	if err := testkit.Wait(5*time.Second, func() error {
		got := ""
		var last uint64
		for _, c := range nodes[0].Changes() {
			if c.Kind == ChangeUpdated {
				continue // node-2 announcing it is leaving
			}
			if c.Epoch <= last || c.At.IsZero() {
				return fmt.Errorf("changes %+v: epochs do not increase, or a change has no time", nodes[0].Changes())
			}
			last = c.Epoch
			got += fmt.Sprintf("%s %s %s %d; ", c.Member, c.Kind, c.State, c.Members)
		}
		if want := "node-0 joined alive 1; node-1 joined alive 2; node-2 joined alive 3; node-2 left left 2; "; got != want {
			return fmt.Errorf("node-0's Changes() = %s; want %s", got, want)
		}
		if last != nodes[0].Epoch() {
			return fmt.Errorf("last change's epoch %d; want the view's, %d", last, nodes[0].Epoch())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
