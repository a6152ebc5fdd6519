package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// testCommand is the README's test command, which .ci/run runs.
const testCommand = "go test -race -json ./... | go run -race ./scripts/testsummary"

// TestREADME: the README's first screen runs Sluice and its tests, says
// that the first run compiles for a while and which ports the node takes;
// CI runs the README's test command, as it is written there; and no
// section runs a binary it has not built (the cluster section uses the CLI
// that scripts/cluster-up.sh builds, the tour the one it builds).
func TestREADME(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	lines := strings.Split(readme, "\n")
	firstScreen := strings.Join(lines[:min(len(lines), 50)], "\n")
	for _, want := range []string{"go run ./cmd/sluice serve", "\n    " + testCommand + "\n", "skipped", "compiles", "8081", "8080", "--grpc-addr", "--http-addr"} {
		if !strings.Contains(firstScreen, want) {
			t.Errorf("the README's first 50 lines lack %q", want)
		}
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "\n"+testCommand+"\n") {
		t.Errorf(".ci/run lacks a line running the README's test command %q", testCommand)
	}

	// Each section (## heading) must build what it runs.
	builders := map[string]*regexp.Regexp{
		"./sluice":              regexp.MustCompile(`go build -o sluice \./cmd/sluice`),
		"sluice-cluster/sluice": regexp.MustCompile(`scripts/cluster-up\.sh`),
	}
	for _, section := range strings.Split(readme, "\n## ") {
		title, _, _ := strings.Cut(section, "\n")
		for _, line := range strings.Split(section, "\n") {
			for bin, builder := range builders {
				cmd := strings.TrimSpace(line)
				if !strings.HasPrefix(cmd, bin+" ") {
					continue
				}
				if before, _, _ := strings.Cut(section, line); !builder.MatchString(before) {
					t.Errorf("README section %q runs %q before anything in it builds %s (%s)", title, cmd, bin, builder)
				}
			}
		}
	}
	if strings.Contains(readme, "scripts/cluster-up.sh") && !strings.Contains(readme, "SLUICE_CLUSTER_PORT_BASE") {
		t.Errorf("the README's cluster section does not say how to move the ports of scripts/cluster-up.sh")
	}
}
