package main

import (
	"encoding/json"
	"net"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestCheck: check prints one decision as a table or JSON and exits 0 when
// allowed, 2 when denied, 1 when the check is invalid.
func TestCheck(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--node-name", "node-a")
	check := func(want int, args ...string) result {
		t.Helper()
		return mustRun(t, want, nil, append([]string{"check", "--addr", n.grpcAddr}, args...)...)
	}

	r := check(exitOK, "user:42", "--limit", "2", "--window", "1m")
	wantLines(t, r.stdout,
		"KEY      RESULT   LIMIT  REMAINING  RETRY AFTER  RESET AFTER  NODE",
		"user:42  allowed  2      1          0s           1m0s         node-a")
	check(exitOK, "user:42", "--limit", "2", "--window", "1m")
	r = check(exitDenied, "user:42", "--limit", "2", "--window", "1m")
	if row := tableRows(t, r.stdout)[0]; row["RESULT"] != "denied" || row["REMAINING"] != "0" || row["RETRY AFTER"] == "0s" {
		t.Errorf("third check of a limit of 2: stdout\n%s\nwant a denied decision", r.stdout)
	}

	r = check(exitDenied, "user:42", "--limit", "2", "--window", "1m", "-o", "json")
	var d sluicepb.Decision
	decodeJSON(t, r.stdout, &d)
	if d.Allowed || d.Limit != 2 || d.Remaining != 0 || d.RetryAfter.AsDuration() <= 0 || d.Node != "node-a" {
		t.Errorf("check -o json on a full key = %v; want denied, limit 2, remaining 0, a retry_after, node node-a", &d)
	}
	for _, field := range []string{`"allowed": false`, `"retry_after"`, `"reset_after"`} {
		if !strings.Contains(r.stdout, field) {
			t.Errorf("check -o json printed\n%s\nwant the field %s (proto names, unpopulated fields too)", r.stdout, field)
		}
	}

	// A peek records nothing; a bigger limit lets hits in again.
	r = check(exitOK, "user:42", "--limit", "3", "--window", "1m", "--peek", "-o", "json")
	decodeJSON(t, r.stdout, &d)
	if !d.Allowed || d.Remaining != 1 {
		t.Errorf("peek with limit 3 after 2 hits = %v; want allowed, remaining 1", &d)
	}
	check(exitOK, "user:42", "--limit", "3", "--window", "1m", "--cost", "1")
	check(exitDenied, "user:42", "--limit", "3", "--window", "1m", "--cost", "1")
	check(exitOK, "user:42", "--limit", "3", "--window", "1m", "--refund")
	check(exitOK, "tb", "--limit", "3", "--window", "1m", "--algorithm", "token_bucket", "--cost", "3")
	check(exitDenied, "tb", "--limit", "3", "--window", "1m", "--algorithm", "token_bucket")

	r = check(exitError, "user:42", "--limit", "2", "--window", "1m", "--cost", "3")
	if !strings.Contains(r.stderr, "InvalidArgument") || !strings.Contains(r.stderr, "above the limit") {
		t.Errorf("check with a cost above the limit: stderr %q; want the server's InvalidArgument message", r.stderr)
	}
	r = check(exitError, "nolimit")
	if !strings.Contains(r.stderr, "--limit and --window are required") {
		t.Errorf("check without a limit: stderr %q; want the flags to give", r.stderr)
	}
}

// TestKeyCommands: key get shows the live state, key list finds the keys,
// key reset forgets the hits.
func TestKeyCommands(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--node-name", "node-a")
	addr := []string{"--addr", n.grpcAddr}
	for range 3 {
		mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "tenant:1:search", "--limit", "10", "--window", "1h")
	}
	mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "tenant:2:search", "--limit", "10", "--window", "1h")
	mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "other", "--limit", "10", "--window", "1h")

	r := mustRun(t, exitOK, nil, append([]string{"key", "get", "tenant:1:search"}, addr...)...)
	fields := tableFields(r.stdout)
	for name, want := range map[string]string{
		"key":       "tenant:1:search",
		"found":     "yes",
		"algorithm": "sliding_log",
		"limit":     "10",
		"window":    "1h0m0s",
		"used":      "3",
		"remaining": "7",
		"node":      "node-a",
	} {
		if got := fields[name]; got != want {
			t.Errorf("key get tenant:1:search printed\n%s\nwant %s %q", r.stdout, name, want)
		}
	}
	if !strings.Contains(r.stdout, "\nHIT TIME                  HITS\n") {
		t.Errorf("key get tenant:1:search printed\n%s\nwant the table of its hits", r.stdout)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "get", "tenant:1:search", "-o", "json"}, addr...)...)
	var got sluicepb.GetKeyResponse
	decodeJSON(t, r.stdout, &got)
	if s := got.State; !s.Found || s.Used != 3 || s.Limit != 10 || string(s.Key) != "tenant:1:search" || s.GetSlidingLog() == nil {
		t.Errorf("key get -o json = %v; want found, used 3, limit 10, a sliding log", s)
	}

	r = mustRun(t, exitOK, nil, append([]string{"key", "list", "--prefix", "tenant:"}, addr...)...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "KEY") || !strings.HasPrefix(lines[1], "tenant:1:search ") || !strings.HasPrefix(lines[2], "tenant:2:search ") {
		t.Errorf("key list --prefix tenant: printed\n%s\nwant a header and the two tenant keys in order", r.stdout)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "list", "-o", "json"}, addr...)...)
	var list sluicepb.ListKeysResponse
	decodeJSON(t, r.stdout, &list)
	if len(list.Keys) != 3 {
		t.Errorf("key list -o json listed %d keys; want 3:\n%s", len(list.Keys), r.stdout)
	}

	r = mustRun(t, exitOK, nil, append([]string{"key", "reset", "tenant:1:search"}, addr...)...)
	if strings.TrimSpace(r.stdout) != "reset tenant:1:search" {
		t.Errorf("key reset printed %q; want \"reset tenant:1:search\"", r.stdout)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "reset", "tenant:1:search", "-o", "json"}, addr...)...)
	var reset sluicepb.ResetKeyResponse
	decodeJSON(t, r.stdout, &reset)
	if reset.Existed {
		t.Errorf("second key reset -o json = %v; want existed false", &reset)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "get", "tenant:1:search"}, addr...)...)
	if tableFields(r.stdout)["found"] != "no" {
		t.Errorf("key get after reset printed\n%s\nwant found no", r.stdout)
	}
}

// TestKeyListPages: without --all, list prints one page and says how to get
// the next; with --all, every key.
func TestKeyListPages(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
		mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, k, "--limit", "1", "--window", "1h")
	}
	r := mustRun(t, exitOK, nil, "key", "list", "--addr", n.grpcAddr, "--page-size", "2")
	if got := strings.Count(r.stdout, "\n"); got != 3 {
		t.Errorf("key list --page-size 2 printed %d lines; want a header and 2 keys:\n%s", got, r.stdout)
	}
	if !strings.Contains(r.stderr, "--page-token") {
		t.Errorf("key list --page-size 2: stderr %q; want how to get the next page", r.stderr)
	}
	r = mustRun(t, exitOK, nil, "key", "list", "--addr", n.grpcAddr, "--page-size", "2", "--all", "-o", "json")
	var list sluicepb.ListKeysResponse
	decodeJSON(t, r.stdout, &list)
	if len(list.Keys) != 5 || list.NextPageToken != "" {
		t.Errorf("key list --all --page-size 2 = %d keys, next page %q; want 5 keys, no next page", len(list.Keys), list.NextPageToken)
	}
}

// TestOverrideCommands: an override set from the CLI applies to checks,
// is listed, and is removed.
func TestOverrideCommands(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	addr := []string{"--addr", n.grpcAddr}
	run := func(want int, args ...string) result {
		t.Helper()
		return mustRun(t, want, nil, append(args, addr...)...)
	}

	r := run(exitOK, "override", "set", "tenant:42", "--limit", "2", "--window", "1m", "--expires-in", "1h", "--note", "INC-1\traise")
	wantLines(t, r.stdout[:strings.Index(r.stdout, "\n")], "KEY        MATCH  LIMIT  WINDOW  ALGORITHM  EXPIRES AT                SET AT                    NOTE")
	if !strings.HasPrefix(strings.Split(r.stdout, "\n")[1], "tenant:42  exact  2      1m0s    -") || !strings.HasSuffix(strings.TrimSpace(r.stdout), "INC-1 raise") {
		t.Errorf("override set printed\n%s\nwant the stored override", r.stdout)
	}
	run(exitOK, "override", "set", "tenant:", "--prefix", "--limit", "100", "--algorithm", "token_bucket")

	// The override gives the limit and window the check leaves out.
	run(exitOK, "check", "tenant:42")
	run(exitOK, "check", "tenant:42")
	r = run(exitDenied, "check", "tenant:42", "--limit", "1000", "--window", "1s")
	if row := tableRows(t, r.stdout)[0]; row["RESULT"] != "denied" || row["LIMIT"] != "2" {
		t.Errorf("check of an overridden key printed\n%s\nwant a denial against the override's limit 2", r.stdout)
	}

	r = run(exitOK, "override", "list", "-o", "json")
	var list sluicepb.ListOverridesResponse
	decodeJSON(t, r.stdout, &list)
	if len(list.Overrides) != 2 {
		t.Fatalf("override list -o json = %d overrides; want 2:\n%s", len(list.Overrides), r.stdout)
	}
	if o := list.Overrides[0]; string(o.Key) != "tenant:" || !o.Prefix || o.Limit != 100 || o.Algorithm != sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET {
		t.Errorf("first override = %v; want the prefix override tenant: (shorter key first)", o)
	}
	if o := list.Overrides[1]; string(o.Key) != "tenant:42" || o.Prefix || o.Limit != 2 || o.Note != "INC-1\traise" || o.ExpiresAt == nil || o.SetAt == nil {
		t.Errorf("second override = %v; want tenant:42, limit 2, the note, an expiry", o)
	}
	r = run(exitOK, "override", "list", "--prefix", "tenant:4")
	if got := strings.Count(r.stdout, "\n"); got != 2 || !strings.Contains(r.stdout, "tenant:42") {
		t.Errorf("override list --prefix tenant:4 printed\n%s\nwant only tenant:42", r.stdout)
	}

	r = run(exitOK, "override", "rm", "tenant:42")
	if want := "removed the exact-key override of tenant:42\n"; r.stdout != want {
		t.Errorf("override rm printed %q; want %q", r.stdout, want)
	}
	r = run(exitOK, "override", "rm", "tenant:42")
	if want := "no exact-key override of tenant:42; nothing removed\n"; r.stdout != want {
		t.Errorf("second override rm printed %q; want %q", r.stdout, want)
	}
	r = run(exitOK, "override", "rm", "tenant:", "--prefix", "-o", "json")
	var del sluicepb.DeleteOverrideResponse
	decodeJSON(t, r.stdout, &del)
	if !del.Existed {
		t.Errorf("override rm tenant: --prefix -o json = %v; want existed", &del)
	}
	r = run(exitOK, "override", "list")
	if r.stdout != "" || !strings.Contains(r.stderr, "no overrides") {
		t.Errorf("override list with none: %v; want nothing on stdout, a note on stderr", r)
	}
}

// TestEnvoyKey: key envoy prints the key of a descriptor, which the other
// commands take as it is or through --envoy.
func TestEnvoyKey(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	addr := []string{"--addr", n.grpcAddr}
	r := mustRun(t, exitOK, nil, append([]string{"key", "envoy", "edge", "remote_address=10.0.0.1", "path=/a b"}, addr...)...)
	key := strings.TrimSuffix(r.stdout, "\n")
	if key != "edge|remote_address=10.0.0.1|path=/a%20b" {
		t.Errorf("key envoy printed %q; want edge|remote_address=10.0.0.1|path=/a%%20b", r.stdout)
	}
	mustRun(t, exitOK, nil, append([]string{"check", "--envoy", "edge", "remote_address=10.0.0.1", "path=/a b", "--limit", "5", "--window", "1m"}, addr...)...)
	r = mustRun(t, exitOK, nil, append([]string{"key", "get", key, "-o", "json"}, addr...)...)
	var got sluicepb.GetKeyResponse
	decodeJSON(t, r.stdout, &got)
	if got.State.Used != 1 {
		t.Errorf("key get of the envoy key after one check: used %d; want 1", got.State.Used)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "get", "--envoy", "edge", "remote_address=10.0.0.1", "path=/a b"}, addr...)...)
	if tableFields(r.stdout)["used"] != "1" {
		t.Errorf("key get --envoy printed\n%s\nwant used 1", r.stdout)
	}
	r = mustRun(t, exitOK, nil, append([]string{"key", "envoy", "edge", "remote_address=10.0.0.1", "-o", "json"}, addr...)...)
	var ek sluicepb.EnvoyKeyResponse
	decodeJSON(t, r.stdout, &ek)
	if string(ek.Key) != "edge|remote_address=10.0.0.1" || ek.Printable != "edge|remote_address=10.0.0.1" {
		t.Errorf("key envoy -o json = %v; want the key and its printable form", &ek)
	}
}

// TestEscapedKeys: keys that are not printable are printed escaped and read
// back with --escaped.
func TestEscapedKeys(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "--escaped", `bin\x00\xff\\`, "--limit", "5", "--window", "1m")
	r := mustRun(t, exitOK, nil, "key", "list", "--addr", n.grpcAddr, "--escaped", "--prefix", `bin\x00`)
	if !strings.Contains(r.stdout, `bin\x00\xff\\ `) {
		t.Errorf("key list printed\n%s\nwant the key escaped as bin\\x00\\xff\\\\", r.stdout)
	}
	r = mustRun(t, exitOK, nil, "key", "get", "--addr", n.grpcAddr, "--escaped", `bin\x00\xff\\`, "-o", "json")
	var got sluicepb.GetKeyResponse
	decodeJSON(t, r.stdout, &got)
	if string(got.State.Key) != "bin\x00\xff\\" || got.State.Used != 1 {
		t.Errorf("key get --escaped = key %q used %d; want the raw bytes and used 1", got.State.Key, got.State.Used)
	}
}

// TestVersion prints the version, commit and Go version.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := mustRun(t, exitOK, nil, "version")
	if !strings.Contains(r.stdout, "version") || !strings.Contains(r.stdout, "go       "+runtime.Version()) {
		t.Errorf("version printed\n%s\nwant version, commit and go %s", r.stdout, runtime.Version())
	}
	r = mustRun(t, exitOK, env{"SLUICE_OUTPUT": "json"}, "version")
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Go != runtime.Version() || v.Version == "" || v.Commit == "" {
		t.Errorf("version with SLUICE_OUTPUT=json printed %q (%v); want JSON with version, commit and go", r.stdout, err)
	}
}

// TestEnvironment: every flag reads SLUICE_<FLAG> when it is not given;
// the command line wins; a bad value names the variable.
func TestEnvironment(t *testing.T) {
	t.Parallel()
	n := startNode(t, env{"SLUICE_NODE_NAME": "from-env", "SLUICE_ADMIN_TOKEN": "s3cret"})
	m := startNode(t, env{"SLUICE_NODE_NAME": "from-env"}, "--node-name", "from-flag")
	dead := "127.0.0.1:1"

	for _, tc := range []struct {
		name     string
		env      env
		args     []string
		wantCode int
		want     string // in stdout
	}{
		{"env used", env{"SLUICE_ADDR": n.grpcAddr}, []string{"check", "k", "--limit", "1", "--window", "1m"}, exitOK, "from-env"},
		{"flag beats env", env{"SLUICE_ADDR": dead}, []string{"check", "k2", "--limit", "1", "--window", "1m", "--addr", m.grpcAddr}, exitOK, "from-flag"},
		{"empty env is unset", env{"SLUICE_ADDR": n.grpcAddr, "SLUICE_OUTPUT": ""}, []string{"check", "k3", "--limit", "1", "--window", "1m"}, exitOK, "KEY"},
		{"output from env", env{"SLUICE_ADDR": n.grpcAddr, "SLUICE_OUTPUT": "json"}, []string{"check", "k4", "--limit", "1", "--window", "1m"}, exitOK, `"allowed": true`},
		{"token from env", env{"SLUICE_ADDR": n.grpcAddr, "SLUICE_ADMIN_TOKEN": "s3cret"}, []string{"key", "get", "k"}, exitOK, "found"},
		{"token flag beats env", env{"SLUICE_ADMIN_TOKEN": "wrong"}, []string{"key", "get", "k", "--addr", n.grpcAddr, "--admin-token", "s3cret"}, exitOK, "found"},
		{"no token", env{"SLUICE_ADDR": n.grpcAddr}, []string{"key", "get", "k"}, exitError, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, tc.env, tc.args...)
			if r.code != tc.wantCode || !strings.Contains(r.stdout, tc.want) {
				t.Errorf("sluice %s with %v: %v\nwant exit code %d and %q on stdout", strings.Join(tc.args, " "), tc.env, r, tc.wantCode, tc.want)
			}
		})
	}
}

// TestBadInput: a bad flag, argument or environment value exits 1 with one
// clear line, before anything is sent or started.
func TestBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  env
		args []string
		want string // in stderr
	}{
		{nil, []string{"nosuchcommand"}, `unknown command "nosuchcommand"`},
		{nil, []string{"check"}, "want one KEY argument, got 0"},
		{nil, []string{"check", "a", "b"}, "want one KEY argument, got 2"},
		{nil, []string{"check", "k", "--limit", "ten"}, `invalid argument "ten" for "--limit"`},
		{nil, []string{"check", "k", "--window", "a while"}, `invalid duration "a while"`},
		{nil, []string{"check", "k", "--algorithm", "leaky"}, "want sliding_log, sliding_window or token_bucket"},
		{nil, []string{"check", "k", "--peek", "--cost", "2"}, "--peek is --cost 0"},
		{nil, []string{"check", "k", "--nosuchflag"}, "unknown flag: --nosuchflag (see sluice check --help)"},
		{nil, []string{"check", "k", "-o", "yaml"}, "want table or json"},
		{nil, []string{"check", "--envoy", "edge", "novalue"}, `descriptor entry "novalue": want key=value`},
		{nil, []string{"check", "--escaped", `bad\q`}, "backslash at byte 3"},
		{nil, []string{"check", "k", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{nil, []string{"key", "get", "k", "--addr", "localhost"}, "--addr localhost has no port (the gRPC API listens on 8081 by default): try --addr localhost:8081"},
		{nil, []string{"bench", "--addr", "::1"}, "--addr ::1 has no port (the gRPC API listens on 8081 by default): try --addr [::1]:8081"},
		{nil, []string{"check", "k", "--addr", "127.0.0.1:"}, "--addr 127.0.0.1: has no port"},
		{nil, []string{"members", "--addr", "127.0.0.1:80:80"}, "--addr 127.0.0.1:80:80: want host:port"},
		{env{"SLUICE_TIMEOUT": "soon"}, []string{"check", "k"}, `SLUICE_TIMEOUT="soon": invalid value for --timeout`},
		{env{"SLUICE_INSECURE": "maybe"}, []string{"key", "get", "k"}, "SLUICE_INSECURE"},
		{nil, []string{"key", "envoy"}, "want a DOMAIN"},
		{nil, []string{"key", "list", "extra"}, `unknown command "extra"`},
		{nil, []string{"override", "set", "k", "--limit", "1", "--expires-in", "1h", "--expires-at", "2030-01-01T00:00:00Z"}, "[expires-at expires-in] were all set"},
		{nil, []string{"override", "set", "k", "--limit", "1", "--expires-at", "tomorrow"}, "want an RFC 3339 time"},
		{nil, []string{"override", "set", "k", "--limit", "1", "--expires-in", "-1h"}, "want a positive duration"},
		{nil, []string{"serve", "--durability", "sometimes"}, "want commit, fsync, async or memory"},
		{env{"SLUICE_DURABILITY": "sometimes"}, []string{"serve"}, `SLUICE_DURABILITY="sometimes"`},
		{env{"SLUICE_MAX_KEYS": "lots"}, []string{"serve"}, "SLUICE_MAX_KEYS"},
		{nil, []string{"serve", "--log-format", "xml"}, "want text or json"},
		{nil, []string{"serve", "--log-level", "loud"}, "want debug, info, warn or error"},
		{nil, []string{"serve", "--actors", "-1"}, "--actors -1: must not be negative"},
		{nil, []string{"serve", "--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s: must not be negative"},
		{nil, []string{"serve", "--max-connections", "-1"}, "--max-connections -1: must not be negative"},
		{nil, []string{"serve", "--max-concurrent-streams", "-5"}, "--max-concurrent-streams -5: must not be negative"},
		{nil, []string{"serve", "--keepalive-timeout", "-1s"}, "--keepalive-timeout -1s: must not be negative"},
		{nil, []string{"serve", "--keepalive-time", "100ms"}, "--keepalive-time 100ms: at least 1s"},
		{nil, []string{"serve", "--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{nil, []string{"serve", "--node-name", ""}, "node name is empty"},
		{nil, []string{"serve", "extra"}, `unknown command "extra"`},
	} {
		r := runCLI(t, tc.env, tc.args...)
		if r.code != exitError || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Errorf("sluice %s with %v: %v\nwant exit code 1, nothing on stdout and one line on stderr containing %q",
				strings.Join(tc.args, " "), tc.env, r, tc.want)
		}
	}
}

// TestConnectionErrors: a client that cannot reach a node says where it
// tried and how to change it.
func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	r := mustRun(t, exitError, nil, "check", "k", "--limit", "1", "--window", "1s", "--addr", "127.0.0.1:1")
	if !strings.Contains(r.stderr, "cannot reach 127.0.0.1:1") || !strings.Contains(r.stderr, "SLUICE_ADDR") {
		t.Errorf("check against a closed port: stderr %q; want the address and the hint", r.stderr)
	}
}

// TestServeStartErrors: a node that cannot start exits 1 with one line
// saying why: the data file is in use, the port is taken.
func TestServeStartErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"data file locked", []string{"--data-dir", n.dataDir, "--grpc-addr", "127.0.0.1:0"}, "locked by another process"},
		{"gRPC port in use", []string{"--data-dir", t.TempDir(), "--grpc-addr", n.grpcAddr}, "address already in use"},
		{"HTTP port in use", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", n.httpAddr}, "address already in use"},
		{"bad limits file", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--limits-file", "/nonexistent/limits.yaml"}, "limits.yaml"},
		{"peer service open", []string{"--data-dir", t.TempDir(), "--grpc-addr", "0.0.0.0:0", "--gossip-addr", "127.0.0.1:0", "--expect", "3"}, "--admin-token"},
		{"peer service open on --peer-addr", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--peer-addr", "0.0.0.0:0", "--gossip-addr", "127.0.0.1:0", "--expect", "3"}, "--peer-addr 0.0.0.0:0"},
		{"cluster without --expect", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, "--expect: set how many nodes bootstrap the cluster together"},
		{"--expect without a cluster", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--expect", "3"}, "--expect 3: a cluster needs --gossip-addr or --join"},
		{"peer address without a cluster", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0"}, "only a cluster node"},
		{"admin port in use", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--admin-addr", n.grpcAddr}, "--admin-addr"},
		{"admin API open", []string{"--data-dir", t.TempDir(), "--grpc-addr", "0.0.0.0:0"}, "--grpc-addr 0.0.0.0:0: the admin API (key reset, overrides) would be open to the network"},
		{"admin API open on --admin-addr", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0", "--refund-token", "r"}, "--admin-addr 0.0.0.0:0: the admin API"},
		{"refunds open", []string{"--data-dir", t.TempDir(), "--grpc-addr", "0.0.0.0:0", "--admin-addr", "127.0.0.1:0"}, "--grpc-addr 0.0.0.0:0: refunds would be open to the network"},
		{"refunds open over HTTP", []string{"--data-dir", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "0.0.0.0:0"}, "--http-addr 0.0.0.0:0: refunds would be open to the network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := runCLI(t, nil, append([]string{"serve", "--http-addr", "127.0.0.1:0", "--log-level", "error"}, tc.args...)...)
			if r.code != exitError || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "sluice serve: ") || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("serve %s: %v\nwant exit code 1 and one line containing %q", strings.Join(tc.args, " "), r, tc.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("serve took %v to fail; want a prompt error", d)
			}
		})
	}
}

// TestServeInsecure: --insecure lets a node serve its admin API and
// refunds on a non-loopback address without a credential, and says so: a
// WARN at start-up, and insecure=true in the start-up line (which shows
// only what differs from the defaults). Before, it was silent and absent.
func TestServeInsecure(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--grpc-addr", "0.0.0.0:0", "--insecure")
	mustRun(t, exitOK, nil, "key", "reset", "k", "--addr", n.grpcAddr)
	n.stop()
	logs := n.logs.String()
	if !strings.Contains(logs, `msg="starting sluice"`) || !strings.Contains(logs, " insecure=true ") {
		t.Errorf("start-up line lacks insecure=true:\n%s", logs)
	}
	if !strings.Contains(logs, `level=WARN msg="--insecure: listeners on non-loopback addresses may serve resets, overrides, refunds and peer calls without a credential`) {
		t.Errorf("no WARN about --insecure:\n%s", logs)
	}
	n = startNode(t, nil)
	n.stop()
	// The start-up line shows the settings that differ from the defaults.
	if logs := n.logs.String(); strings.Contains(logs, "insecure=true") || strings.Contains(logs, "--insecure:") {
		t.Errorf("without --insecure: want no insecure=true and no warning:\n%s", logs)
	}
}

// TestServeSeparateListeners: a cluster node may serve decisions on a
// public address without an admin credential when its peer service and
// admin API are on loopback addresses (a refund token guards its refunds);
// the ready file
// names the peer and admin listeners; admin calls go to --admin-addr only.
func TestServeSeparateListeners(t *testing.T) {
	t.Parallel()
	oneClusterAtATime(t)
	t.Cleanup(func() { waitMemberlistGone(t) })
	n := startNode(t, nil, "--grpc-addr", "0.0.0.0:0", "--peer-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--refund-token", "r3fund",
		"--gossip-addr", "127.0.0.1:0", "--expect", "1", "--node-name", "split")
	n.waitReadyz()
	if n.peerAddr == "" || n.adminAddr == "" || n.peerAddr == n.adminAddr {
		t.Fatalf("ready file: peer %q, admin %q; want two listeners of their own", n.peerAddr, n.adminAddr)
	}
	r := mustRun(t, exitOK, nil, "members", "--addr", n.adminAddr)
	if !strings.Contains(r.stdout, "split") {
		t.Errorf("members --addr %s (admin) printed\n%s\nwant the node", n.adminAddr, r.stdout)
	}
	_, port, _ := net.SplitHostPort(n.grpcAddr)
	grpcAddr := net.JoinHostPort("127.0.0.1", port)
	r = mustRun(t, exitError, nil, "members", "--addr", grpcAddr)
	if !strings.Contains(r.stderr, "does not serve the admin API") || !strings.Contains(r.stderr, "--admin-addr") {
		t.Errorf("members --addr %s (gRPC): stderr %q; want no admin API there, pointing at --admin-addr", grpcAddr, r.stderr)
	}
	mustRun(t, exitOK, nil, "check", "split:1", "--limit", "1", "--window", "1m", "--addr", grpcAddr)
}

// TestServeLogs: serve's start-up line shows, in text or JSON, the version
// and the settings that differ from their defaults (the tokens redacted),
// and no default; the whole configuration is at debug level.
func TestServeLogs(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--admin-token", "t0psecret", "--refund-token", "r3fundsecret", "--log-format", "json", "--node-name", "logged", "--max-connection-age", "1h")
	n.stop()
	logs := n.logs.String()
	if strings.Contains(logs, "t0psecret") || strings.Contains(logs, "r3fundsecret") {
		t.Errorf("the logs hold a token:\n%s", logs)
	}
	var first map[string]any
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	for i, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %d is not JSON: %q", i, line)
		}
		if i == 0 {
			first = rec
		}
	}
	transport, _ := first["transport"].(map[string]any)
	if first["msg"] != "starting sluice" || first["version"] == nil || first["admin_token"] != "[redacted]" || first["refund_token"] != "[redacted]" ||
		first["node_name"] != "logged" || transport["max_connection_age"] != "1h0m0s" {
		t.Errorf("first log record = %v; want the settings changed, tokens redacted", first)
	}
	// Defaults, and the members of a group left at theirs, are not shown.
	for _, key := range []string{"durability", "limits_poll_interval", "shadow", "cluster", "limits_xds"} {
		if v, ok := first[key]; ok {
			t.Errorf("the start-up line shows %s=%v, a default", key, v)
		}
	}
	if len(transport) != 1 {
		t.Errorf("the start-up line shows transport=%v; want max_connection_age alone", transport)
	}
	if len(lines[0]) > 600 {
		t.Errorf("the start-up line is %d bytes; want a line a person reads:\n%s", len(lines[0]), lines[0])
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"msg":"stopped"`) {
		t.Errorf("last log line %q; want the stop", last)
	}
}

// wantLines fails unless out holds exactly the lines want.
func wantLines(t *testing.T, out string, want ...string) {
	t.Helper()
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("output:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// cellSep separates the cells of a table: tabwriter pads with two spaces
// or more.
var cellSep = regexp.MustCompile(`\s{2,}`)

// tableRows parses a table with a header line into one map per row.
func tableRows(t *testing.T, out string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := cellSep.Split(lines[0], -1)
	var rows []map[string]string
	for _, line := range lines[1:] {
		cells := cellSep.Split(strings.TrimSpace(line), -1)
		if len(cells) != len(header) {
			t.Fatalf("table row %q has %d cells; the header %q has %d", line, len(cells), lines[0], len(header))
		}
		row := make(map[string]string)
		for i, h := range header {
			row[h] = cells[i]
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		t.Fatalf("table without rows:\n%s", out)
	}
	return rows
}

// tableFields parses the name/value table of key get, up to the first
// blank line.
func tableFields(out string) map[string]string {
	fields := make(map[string]string)
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			break
		}
		if name, value, ok := strings.Cut(line, "  "); ok {
			fields[name] = strings.TrimSpace(value)
		}
	}
	return fields
}

func itoa(n int) string { return strconv.Itoa(n) }
