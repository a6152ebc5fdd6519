package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/sluice-io/sluice/cmd/sluice/node"
)

// TestServeDefaultsAreNodeDefaults: sluice serve without flags configures
// the node exactly as node.DefaultConfig does, so that the nodes the tests
// build (node, nodetest: DefaultConfig, then New) are the nodes users run;
// what serve resolves on top (the replicas, the runtime limits, the
// refusals) is the node's (node.Config.WithDefaults, SetRuntimeLimits,
// Validate).
func TestServeDefaultsAreNodeDefaults(t *testing.T) {
	cl := &cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	o := &serveOptions{cfg: node.DefaultConfig()}
	cmd := cl.serveCommandFor(o)
	if err := cmd.Flags().Parse(nil); err != nil {
		t.Fatal(err)
	}
	if want := node.DefaultConfig(); !reflect.DeepEqual(o.cfg, want) {
		t.Errorf("serve's flags left at their defaults give\n%+v\nwant node.DefaultConfig()\n%+v", o.cfg, want)
	}
}
