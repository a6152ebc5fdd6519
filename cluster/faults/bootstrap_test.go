//go:build linux

package faults

// bootstrapFlows returns this file's rows of TestOperatorFlows.
func bootstrapFlows() []scenario { return nil }
