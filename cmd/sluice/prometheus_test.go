package main

import (
	"os"
	"os/exec"
	"testing"
)

// promRules is the directory of the example alerting rules, from this
// package's directory.
const promRules = "../../scripts/prometheus"

// TestPrometheusRules: the alerting rules of docs/operations.md load in
// Prometheus (promtool check rules) and their unit tests pass (promtool
// test rules: calls cancelled by their client fire no error alert, a node
// without a lease and a missing member do). It needs promtool on PATH
// (Debian's prometheus package; .ci/run installs it); without it the test
// is skipped, except under CI.
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		msg := "promtool not found on PATH (apt-get install prometheus; .ci/run installs it)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	for _, args := range [][]string{
		{"check", "rules", "sluice-rules.yaml"},
		{"test", "rules", "sluice-rules_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = promRules
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
