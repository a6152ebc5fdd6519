//go:build linux

package faults

// controlFlows returns this file's rows of TestOperatorFlows.
func controlFlows() []scenario { return nil }
