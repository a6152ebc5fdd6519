package main

import (
	"encoding/json"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cmd/sluice/node"
)

// TestServeLogsReadable: the configuration logged at debug level shows the
// values in force (the engine's defaults resolved, not zeros; no cluster
// settings for a single node), durations and times read as such in text
// and in JSON, and no INFO line carries err=<nil>.
func TestServeLogsReadable(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--actors", "0", "--log-level", "debug")
	mustRun(t, exitOK, nil, "check", "k", "--limit", "3", "--window", "1h", "--addr", n.grpcAddr)
	n.stop()
	logs := n.logs.String()
	for _, want := range []string{
		" engine.actors=" + strconv.Itoa(4*runtime.GOMAXPROCS(0)) + " ",
		" engine.max_keys=131072 ",
		" engine.mailbox_size=1024 ",
		" limits_poll_interval=2s ",
		" shutdown_timeout=10s ",
		`msg="closed data file"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("serve logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "<nil>") {
		t.Errorf("serve logs hold <nil>:\n%s", logs)
	}
	if strings.Contains(logs, "cluster.") {
		t.Errorf("a single node logged cluster settings:\n%s", logs)
	}
	if strings.Contains(logs, "next_deadline=") {
		t.Errorf("a new data file logged a next deadline:\n%s", logs)
	}

	// The data file now holds a key whose deadline is an hour away: the
	// next start says when, as a time.
	m := startNode(t, nil, "--data-dir", n.dataDir, "--log-format", "json", "--shutdown-timeout", "1m30s", "--log-level", "debug")
	m.stop()
	var sawDeadline, sawStart bool
	for _, line := range strings.Split(strings.TrimSpace(m.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		switch rec["msg"] {
		case "starting sluice":
			if rec["shutdown_timeout"] != "1m30s" || rec["limits_poll_interval"] != nil {
				t.Errorf("JSON start-up line: shutdown_timeout %v, limits_poll_interval %v; want \"1m30s\" and the default not shown", rec["shutdown_timeout"], rec["limits_poll_interval"])
			}
		case "configuration":
			sawStart = true
			if rec["shutdown_timeout"] != "1m30s" || rec["limits_poll_interval"] != "2s" {
				t.Errorf("JSON configuration log: shutdown_timeout %v, limits_poll_interval %v; want \"1m30s\", \"2s\"", rec["shutdown_timeout"], rec["limits_poll_interval"])
			}
		case "opened data file":
			s, _ := rec["next_deadline"].(string)
			d, err := time.Parse(time.RFC3339, s)
			if sawDeadline = err == nil; err != nil || d.Before(time.Now()) || d.After(time.Now().Add(2*time.Hour)) {
				t.Errorf("opened data file: next_deadline %v; want an RFC 3339 time within the next two hours", rec["next_deadline"])
			}
		case "shutting down":
			if rec["timeout"] != "1m30s" {
				t.Errorf("shutting down: timeout %v; want \"1m30s\"", rec["timeout"])
			}
		}
	}
	if !sawStart || !sawDeadline {
		t.Errorf("JSON logs lack the start-up line or the next deadline:\n%s", m.logs)
	}
	if regexp.MustCompile(`"level":"INFO"[^\n]*"err":null`).MatchString(m.logs.String()) {
		t.Errorf("JSON logs hold an INFO line with a null err:\n%s", m.logs)
	}
}

// TestGoMemoryLimit: --memory-limit (the container's limit, from the
// downward API) sets the Go runtime's soft limit to 90% of it, unless
// GOMEMLIMIT chose one; without a limit nothing is set.
func TestGoMemoryLimit(t *testing.T) {
	for _, tt := range []struct {
		limit      int64
		gomemlimit string
		want       int64
		set        bool
	}{
		{1 << 30, "", 966367641, true},
		{1 << 30, "500MiB", 0, false},
		{0, "", 0, false},
	} {
		got, set := node.GoMemoryLimit(tt.limit, tt.gomemlimit)
		if got != tt.want || set != tt.set {
			t.Errorf("GoMemoryLimit(%d, %q) = %d, %v; want %d, %v", tt.limit, tt.gomemlimit, got, set, tt.want, tt.set)
		}
	}
}
