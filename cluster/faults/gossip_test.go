//go:build linux

package faults

// gossipFlows returns this file's rows of TestOperatorFlows.
func gossipFlows() []scenario { return nil }
