package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cmd/sluice/loadgen"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// bench runs "sluice bench args" with ctx (30s at most) in the
// environment e.
func bench(t testing.TB, ctx context.Context, e env, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append([]string{"bench"}, args...), &stdout, &stderr, e.get)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// benchJSON runs a short, quiet bench against addr with args (later flags
// win) and returns its JSON report; it fails the test unless bench exits 0.
func benchJSON(t testing.TB, addr string, args ...string) loadgen.Report {
	t.Helper()
	full := append([]string{"--addr", addr, "-o", "json", "--quiet",
		"--duration", "300ms", "--warmup", "100ms", "--concurrency", "4"}, args...)
	r := bench(t, context.Background(), nil, full...)
	if r.code != exitOK {
		t.Fatalf("sluice bench %s: %v; want exit code 0", strings.Join(full, " "), r)
	}
	var rep loadgen.Report
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("sluice bench %s printed\n%s\nnot a report: %v", strings.Join(full, " "), r.stdout, err)
	}
	return rep
}

// checkConsistent fails unless rep adds up: no errors, decisions = calls ×
// batch = allowed + denied, latencies positive and ordered.
func checkConsistent(t testing.TB, rep loadgen.Report) {
	t.Helper()
	batch := int64(rep.Settings.Batch)
	if rep.Calls == 0 || rep.Errors != 0 || len(rep.ErrorCodes) != 0 || rep.FirstError != "" {
		t.Errorf("report %+v; want calls and no errors", rep)
	}
	if rep.Decisions != rep.Calls*batch || rep.Allowed+rep.Denied != rep.Decisions {
		t.Errorf("%d calls of %d checks: %d decisions, %d allowed + %d denied; want decisions = calls × batch = allowed + denied",
			rep.Calls, batch, rep.Decisions, rep.Allowed, rep.Denied)
	}
	if p := []float64{rep.P50us, rep.P90us, rep.P99us, rep.P999us, rep.MaxUs}; !(p[0] > 0 && p[0] <= p[1] && p[1] <= p[2] && p[2] <= p[3] && p[3] <= p[4]) {
		t.Errorf("latency p50 %g ≤ p90 %g ≤ p99 %g ≤ p99.9 %g ≤ max %g µs: want positive and ordered", p[0], p[1], p[2], p[3], p[4])
	}
	if rep.MeanUs <= 0 || rep.MeanUs > rep.MaxUs {
		t.Errorf("mean latency %gµs, max %gµs; want 0 < mean ≤ max", rep.MeanUs, rep.MaxUs)
	}
	if rep.ElapsedS <= 0 || rep.CallsPerS <= 0 || rep.DecisionsPerS < rep.CallsPerS || rep.Interrupted || rep.Unfinished != 0 {
		t.Errorf("report %+v; want a positive elapsed time and rates, not interrupted", rep)
	}
}

// TestBench: bench drives a node through both APIs, in closed and open
// loop, with every key distribution and batch size, and its report adds
// up.
func TestBench(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"closed native uniform", []string{"--dist", "uniform"}},
		{"closed native zipf batch 10", []string{"--dist", "zipf", "--zipf-s", "1.5", "--batch", "10"}},
		{"closed native hot token bucket", []string{"--dist", "hot", "--algorithm", "token_bucket"}},
		{"closed envoy hot", []string{"--api", "envoy", "--dist", "hot"}},
		{"closed envoy uniform batch 10", []string{"--api", "envoy", "--batch", "10", "--keys", "100"}},
		{"closed client uniform", []string{"--api", "client"}},
		{"closed client batch 10 routing on", []string{"--api", "client", "--batch", "10", "--routing", "on"}},
		// Open loop: a call the workers cannot send on time is not sent,
		// and the calls due in the warmup are sent before those measured.
		// At 300 calls/s, on 2 cores busy with three other processes, the
		// four workers of the race-built bench worked through the
		// warmup's 300 calls until the end and sent none of the measured
		// 900 (3 runs of 6; all sent at 50 calls/s, p99 30 to 105 ms).
		{"open native hot batch 10", []string{"--rate", "50", "--dist", "hot", "--batch", "10", "--duration", "3s", "--warmup", "1s"}},
		{"open envoy zipf", []string{"--rate", "50", "--api", "envoy", "--dist", "zipf", "--duration", "3s", "--warmup", "1s"}},
	} {
		// One at a time: closed loops beside it would take the cores an
		// open loop needs to send on time.
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--key-prefix", tc.name + ":"}, tc.args...)
			rep := benchJSON(t, n.grpcAddr, args...)
			// A call that starts in the warmup is not recorded, and on a
			// machine busy with the other race-built packages a worker's
			// first call can outlast the warmup and the whole run (CI:
			// 1.4 s): nothing is recorded then. Run again, within a
			// deadline, rather than fail on the machine's load.
			for deadline := time.Now().Add(20 * time.Second); rep.Calls == 0 && rep.Errors == 0 && time.Now().Before(deadline); {
				t.Logf("no call recorded in %gs, nor any error (the machine is busy): running again", rep.ElapsedS)
				rep = benchJSON(t, n.grpcAddr, args...)
			}
			checkConsistent(t, rep)
			if rep.Denied != 0 {
				t.Errorf("%d denied under the default limit; want none", rep.Denied)
			}
			s := rep.Settings
			duration, warmup := 0.3, 0.1
			if slices.Contains(tc.args, "3s") {
				duration, warmup = 3, 1
			}
			if s.Addr != n.grpcAddr || s.Concurrency != 4 || s.Connections != 4 || s.DurationS != duration || s.WarmupS != warmup || s.KeyPrefix != tc.name+":" {
				t.Errorf("settings %+v; want the flags given", s)
			}
		})
	}
}

// TestBenchJSONFields: the report's JSON has every documented field, even
// when zero.
func TestBenchJSONFields(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(loadgen.Report{})
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"calls", "decisions", "allowed", "denied", "errors", "error_codes", "first_error",
		"calls_per_s", "decisions_per_s", "elapsed_s", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us",
		"unsent", "unfinished", "interrupted", "settings"} {
		if _, ok := fields[name]; !ok {
			t.Errorf("report JSON %s has no field %q", b, name)
		}
	}
	settings := fields["settings"].(map[string]any)
	for _, name := range []string{"addr", "api", "mode", "rate", "concurrency", "connections", "duration_s", "warmup_s",
		"keys", "dist", "zipf_s", "key_prefix", "batch", "limit", "window_ms", "algorithm", "timeout_ms", "seed"} {
		if _, ok := settings[name]; !ok {
			t.Errorf("report JSON settings %v have no field %q", settings, name)
		}
	}
}

// TestBenchExact: with a low limit, bench sees exactly as many allowed
// checks as exactness requires: the limit on one hot key, or the limit per
// key on few keys, within a window longer than the run, whatever the API,
// the batch or the loop. The node agrees.
func TestBenchExact(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	for _, tc := range []struct {
		name        string
		args        []string
		wantAllowed int64
		hotKey      string // if not "", key get must show it used up
	}{
		{"native hot", []string{"--dist", "hot", "--limit", "20"}, 20, "exact-native-hot:0"},
		{"envoy hot batch 10", []string{"--api", "envoy", "--dist", "hot", "--limit", "25", "--batch", "10"}, 25, "bench|key=exact-envoy-hot-batch-10:0"},
		{"native open hot", []string{"--rate", "400", "--dist", "hot", "--limit", "30"}, 30, "exact-native-open-hot:0"},
		{"native uniform 5 keys batch 10", []string{"--keys", "5", "--limit", "10", "--batch", "10"}, 5 * 10, ""},
		{"envoy zipf 3 keys", []string{"--api", "envoy", "--dist", "zipf", "--keys", "3", "--limit", "10"}, 3 * 10, ""},
		{"client uniform 5 keys batch 10", []string{"--api", "client", "--keys", "5", "--limit", "10", "--batch", "10"}, 5 * 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prefix := "exact-" + strings.ReplaceAll(tc.name, " ", "-") + ":"
			// No warmup: its checks would count on the node, not in the
			// report. Two seconds, so that even on a loaded machine every
			// key (the coldest of a zipf too) gets past its limit.
			rep := benchJSON(t, n.grpcAddr, append([]string{"--key-prefix", prefix, "--window", "1h", "--warmup", "0", "--duration", "2s"}, tc.args...)...)
			checkConsistent(t, rep)
			if rep.Allowed != tc.wantAllowed || rep.Denied == 0 {
				t.Errorf("bench %s: %d allowed, %d denied; want exactly %d allowed, the rest denied",
					strings.Join(tc.args, " "), rep.Allowed, rep.Denied, tc.wantAllowed)
			}
			if tc.hotKey != "" {
				r := mustRun(t, exitOK, nil, "key", "get", tc.hotKey, "--addr", n.grpcAddr, "-o", "json")
				var got sluicepb.GetKeyResponse
				decodeJSON(t, r.stdout, &got)
				if got.State.Used != tc.wantAllowed {
					t.Errorf("key get %s after the bench: used %d; want %d", tc.hotKey, got.State.Used, tc.wantAllowed)
				}
			}
		})
	}
}

// TestBenchOpenLoopRate: an open loop at a low rate sends rate × duration
// calls: every call due in the run is sent, or counted as unsent, and on a
// machine with CPU to spare most of them are sent.
//
// A call costs about 1.7 ms of CPU under the race detector (client and
// in-process server together, measured with sluice bench against a -race
// build): 400 calls/s in each of two parallel subtests asked for 1.4 of
// the machine's 2 cores, beside the rest of the test run, and the
// generator fell behind (0 to 73 of 200 calls sent). At 100 calls/s, one
// API after the other and outside the parallel tests, the load needs a
// sixth of a core, and only a stall of half a second could leave half
// of the calls unsent: the run is then made again.
func TestBenchOpenLoopRate(t *testing.T) {
	n := startNode(t, nil, "--durability", "memory")
	for _, api := range []string{"native", "envoy"} {
		t.Run(api, func(t *testing.T) {
			args := []string{"--api", api, "--rate", "100", "--duration", "1s", "--warmup", "200ms", "--concurrency", "8"}
			rep := benchJSON(t, n.grpcAddr, args...)
			// Such a stall happens in CI, where the other packages run
			// beside this one (49 of 100 sent): every run must account
			// for each call due, and one within a deadline send most.
			for deadline := time.Now().Add(20 * time.Second); rep.Calls+rep.Unsent == 100 && rep.Calls <= 50 && time.Now().Before(deadline); {
				if rep.Errors != 0 {
					t.Fatalf("open loop at 100 calls/s: %d errors (first: %s); want none", rep.Errors, rep.FirstError)
				}
				t.Logf("%d of 100 calls due sent, %d counted unsent (the machine stalled the generator): running again", rep.Calls, rep.Unsent)
				rep = benchJSON(t, n.grpcAddr, args...)
			}
			checkConsistent(t, rep)
			// Exactly 100 calls are due.
			if rep.Calls+rep.Unsent != 100 || rep.Calls <= 50 || rep.ElapsedS != 1 {
				t.Errorf("open loop at 100 calls/s for 1s: %d calls, %d unsent in %gs; want 100 calls due, most of them sent",
					rep.Calls, rep.Unsent, rep.ElapsedS)
			}
			if s := rep.Settings; s.Mode != "open" || s.Rate != 100 {
				t.Errorf("settings %+v; want an open loop at 100/s", s)
			}
		})
	}
}

// progressLine is a line of bench's live progress.
var progressLine = regexp.MustCompile(`(?m)^ +\d+s (warmup|running) +\d+ calls/s +\d+ decisions/s +p99 \S+ +errors \d+$`)

// TestBenchTable: without -o json, bench prints its settings and results
// as a table, and a progress line a second on stderr.
func TestBenchTable(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	r := bench(t, context.Background(), nil, "--addr", n.grpcAddr, "--duration", "1500ms", "--warmup", "0", "--concurrency", "2", "--batch", "5")
	if r.code != exitOK {
		t.Fatalf("sluice bench: %v; want exit code 0", r)
	}
	if got := progressLine.FindAllString(r.stderr, -1); len(got) != 1 || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("bench for 1.5s: stderr\n%s\nwant one progress line, at 1s", r.stderr)
	}
	fields := tableFields(r.stdout)
	for _, name := range []string{"addr", "api", "mode", "duration", "keys", "checks"} {
		if fields[name] == "" {
			t.Errorf("bench printed\n%s\nwant the setting %q", r.stdout, name)
		}
	}
	if fields["api"] != "native" || !strings.HasPrefix(fields["mode"], "closed loop, 2 workers on 2 connections") {
		t.Errorf("bench printed\n%s\nwant api native, a closed loop of 2 workers", r.stdout)
	}
	results := tableFields(r.stdout[strings.Index(r.stdout, "\n\n")+2:])
	for _, name := range []string{"elapsed", "calls", "decisions", "allowed", "denied", "errors",
		"latency p50", "latency p90", "latency p99", "latency p99.9", "latency max", "latency mean"} {
		if results[name] == "" {
			t.Errorf("bench printed\n%s\nwant the result %q", r.stdout, name)
		}
	}
	if results["errors"] != "0" || results["denied"] != "0" || results["elapsed"] != "1.5s" {
		t.Errorf("bench printed\n%s\nwant no errors, nothing denied, 1.5s elapsed", r.stdout)
	}
}

// cancelOnProgress is a stderr that cancels a run once a progress line
// shows recorded calls.
type cancelOnProgress struct {
	testkit.SyncBuffer
	cancel context.CancelFunc
}

func (c *cancelOnProgress) Write(p []byte) (int, error) {
	n, err := c.SyncBuffer.Write(p)
	for _, line := range progressLine.FindAllString(c.String(), -1) {
		if strings.Contains(line, "running") && !strings.Contains(line, "p99 - ") {
			c.cancel()
		}
	}
	return n, err
}

// TestBenchInterrupted: a cancelled context (SIGINT) stops bench early; it
// prints what it measured and exits 0.
func TestBenchInterrupted(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stderr := &cancelOnProgress{cancel: cancel}
	var stdout bytes.Buffer
	args := []string{"bench", "--addr", n.grpcAddr, "-o", "json", "--duration", "1m", "--warmup", "0", "--concurrency", "4"}
	start := time.Now()
	code := run(ctx, args, &stdout, stderr, env(nil).get)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("bench interrupted after its first progress line took %v to stop", d)
	}
	if code != exitOK {
		t.Fatalf("interrupted bench: exit code %d\nstdout:\n%s\nstderr:\n%s\nwant exit code 0", code, stdout.String(), stderr.String())
	}
	var rep loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("interrupted bench printed %q: %v", stdout.String(), err)
	}
	if !rep.Interrupted || rep.ElapsedS < 1 || rep.ElapsedS > 20 || rep.Calls == 0 || rep.Errors != 0 {
		t.Errorf("interrupted bench: %+v; want interrupted after 1s or a little more, with calls, no errors", rep)
	}
}

// TestBenchEnvironment: the connection flags read SLUICE_<FLAG>; the flags
// of the load do not.
func TestBenchEnvironment(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	e := env{"SLUICE_ADDR": n.grpcAddr, "SLUICE_OUTPUT": "json", "SLUICE_BATCH": "0", "SLUICE_API": "grpc", "SLUICE_LIMIT": "x"}
	r := bench(t, context.Background(), e, "--quiet", "--duration", "200ms", "--warmup", "0", "--concurrency", "2")
	if r.code != exitOK {
		t.Fatalf("bench with %v: %v; want exit code 0", e, r)
	}
	var rep loadgen.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("bench with SLUICE_OUTPUT=json printed %q: %v", r.stdout, err)
	}
	if s := rep.Settings; s.Addr != n.grpcAddr || s.Batch != 1 || s.API != loadgen.Native || s.Limit != 1_000_000_000 {
		t.Errorf("bench with %v: settings %+v; want the address from SLUICE_ADDR, the defaults of batch, api and limit", e, s)
	}
}

// TestBenchBadInput: bad flags, and checks the server refuses, end bench
// with exit code 1 and one line saying what to change.
func TestBenchBadInput(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"--api", "grpc"}, `invalid argument "grpc" for "--api" flag: want native, envoy or client`},
		{[]string{"--routing", "on"}, "--routing applies to --api client"},
		{[]string{"--api", "client", "--routing", "sideways"}, `invalid argument "sideways" for "--routing" flag: want auto, on or off`},
		{[]string{"--concurrency", "0"}, "--concurrency 0: want at least 1 worker"},
		{[]string{"--concurrency", "4", "--connections", "8"}, "--connections 8: more connections than the 4 workers"},
		{[]string{"--duration", "0"}, "--duration 0s: want a positive duration"},
		{[]string{"--warmup", "-1s"}, "--warmup -1s: want 0 or a positive duration"},
		{[]string{"--rate", "-5"}, "--rate -5: want calls per second, or 0 for a closed loop"},
		{[]string{"--rate", "fast"}, `invalid argument "fast" for "--rate"`},
		{[]string{"--keys", "0"}, "--keys 0: want at least 1 key"},
		{[]string{"--dist", "pareto"}, "want uniform, zipf or hot"},
		{[]string{"--dist", "zipf", "--zipf-s", "1"}, "--zipf-s 1: want an exponent above 1"},
		{[]string{"--zipf-s", "2"}, "--zipf-s applies to --dist zipf, not uniform"},
		{[]string{"--dist", "hot", "--keys", "10"}, "--keys: --dist hot uses one key"},
		{[]string{"--batch", "0"}, "--batch 0: want at least 1 check per call"},
		{[]string{"--limit", "0"}, "--limit 0: want at least 1 hit per window"},
		{[]string{"--window", "0"}, "--window 0s: want a positive duration"},
		{[]string{"--api", "envoy", "--window", "1500ms"}, "--window 1.5s: Envoy's API counts windows in whole seconds"},
		{[]string{"--api", "envoy", "--limit", "5000000000"}, "--limit 5000000000: above 4294967295"},
		{[]string{"--api", "envoy", "--algorithm", "token_bucket"}, "--algorithm token_bucket: Envoy's API has no algorithm field"},
		{[]string{"--algorithm", "leaky"}, "want sliding_log, sliding_window or token_bucket"},
		{[]string{"--timeout", "0"}, "--timeout 0s: want a positive deadline per call"},
		{[]string{"--tls-cert", "c.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"-o", "yaml"}, "want table or json"},
		{[]string{"extra"}, `unknown command "extra" for "sluice bench"`},
		{[]string{"--addr", ""}, "--addr is empty"},
		{[]string{"--addr", "127.0.0.1:1"}, "cannot reach 127.0.0.1:1"},
		// The server refuses these checks: bench stops at the first call,
		// long before the end of its minute.
		{[]string{"--addr", n.grpcAddr, "--batch", "5000"}, "5000 checks in one call; the maximum is 1000: split the batch (InvalidArgument)"},
		{[]string{"--addr", n.grpcAddr, "--window", "100us"}, "InvalidArgument"},
	} {
		args := append([]string{"--quiet", "--duration", "1m", "--warmup", "0", "--concurrency", "2"}, tc.args...)
		start := time.Now()
		r := bench(t, context.Background(), nil, args...)
		if r.code != exitError || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Errorf("sluice bench %s: %v\nwant exit code 1, nothing on stdout and one line on stderr containing %q",
				strings.Join(args, " "), r, tc.want)
		}
		// Half the minute it was given: a run that went on past the first
		// call takes it all, and a loaded machine (the fault suite beside
		// it) has taken 12 s to start the client and fail.
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("sluice bench %s took %v to fail; want it to stop at the first call, long before its minute", strings.Join(args, " "), d)
		}
	}
}

// TestBenchLeavesNoErrors: a clean bench run, of either API, leaves
// sluice_decisions_total{result="error"} at 0 on the node: the probe of
// each connection before the run is a peek the node answers, and the
// calls in flight at the end finish before the bench closes. Before, each
// connection's probe was an empty batch refused as INVALID_ARGUMENT: 8
// errors per run, and an error-ratio alert on a load test.
func TestBenchLeavesNoErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--durability", "memory")
	for _, api := range []string{"native", "envoy"} {
		rep := benchJSON(t, n.grpcAddr, "--api", api, "--connections", "8", "--concurrency", "8", "--key-prefix", "noerr-"+api+":")
		if rep.Errors != 0 {
			t.Errorf("bench --api %s: %d errors; want none", api, rep.Errors)
		}
	}
	resp, err := http.Get("http://" + n.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, api := range []string{"native", "envoy"} {
		want := fmt.Sprintf(`sluice_decisions_total{api=%q,result="error"} 0`, api)
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("after a clean bench run, /metrics lacks %s:\n%s", want, grepLines(string(body), "sluice_decisions_total"))
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
