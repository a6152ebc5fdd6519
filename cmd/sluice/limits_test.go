package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLimitsCheck: limits check loads each path as serve would, prints
// FILE:LINE for each problem and exits 1, or ok and exits 0.
func TestLimitsCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, data string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("ratelimit/config/edge.yaml", "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	good := filepath.Join(dir, "ratelimit")
	bad := write("bad.yaml", "domain: x\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n  - kee: y\n")

	r := mustRun(t, exitOK, nil, "limits", "check", good)
	if want := good + ": ok, 1 domain (edge), 1 rule\n"; r.stdout != want {
		t.Errorf("limits check of a good runtime directory printed %q; want %q", r.stdout, want)
	}
	r = mustRun(t, exitError, nil, "limits", "check", good, bad)
	for _, want := range []string{bad + ":4: unknown unit \"fortnight\"", bad + ":5: unknown field \"kee\""} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("limits check of a bad file printed\n%s\nwant a line with %q", r.stdout, want)
		}
	}
	if !strings.Contains(r.stderr, "1 of 2 limits paths did not load") {
		t.Errorf("stderr %q; want the count of paths that did not load", r.stderr)
	}

	// A domain in two files loads with --merge-domain-config only.
	write("ratelimit/config/edge-more.yaml", "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	r = mustRun(t, exitError, nil, "limits", "check", good)
	if !strings.Contains(r.stdout, "--merge-domain-config") {
		t.Errorf("limits check of a domain in two files printed %q; want a hint at --merge-domain-config", r.stdout)
	}
	r = mustRun(t, exitOK, nil, "limits", "check", "--merge-domain-config", good)
	if want := good + ": ok, 1 domain (edge), 2 rules\n"; r.stdout != want {
		t.Errorf("limits check --merge-domain-config printed %q; want %q", r.stdout, want)
	}
}
