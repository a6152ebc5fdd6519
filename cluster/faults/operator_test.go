//go:build linux

package faults

import (
	"slices"
	"testing"
)

// operatorFlows returns the operator flows and control-plane faults of
// issue 52: the runbook's replacement of a dead node, a forgotten
// member's keys meeting members that joined or came back since, a first
// start with --expect below the node count, gossip-only cuts, a stranger
// in gossip, the leader frozen while a node starts its epoch, and a
// standby lane stalled across an epoch change. Each file adds its own.
func operatorFlows() []scenario {
	return slices.Concat(forgetFlows(), gossipFlows(), bootstrapFlows(), controlFlows())
}

// TestOperatorFlows runs the operator flows as TestFaults runs the single
// faults, with the same checks.
func TestOperatorFlows(t *testing.T) {
	requireNetns(t)
	runScenarios(t, operatorFlows(), "what each operator flow cost")
}
