//go:build linux

package faults

// forgetFlows returns this file's rows of TestOperatorFlows.
func forgetFlows() []scenario { return nil }
