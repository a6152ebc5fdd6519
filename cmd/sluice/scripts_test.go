//go:build unix

package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/cluster/clustertest"
)

// TestClusterUpPorts: scripts/cluster-up.sh takes its ports from
// SLUICE_CLUSTER_PORT_BASE and SLUICE_CLUSTER_GOSSIP_BASE (so that it runs
// beside anything holding 9091 or 7947), runs SLUICE_CLUSTER_BIN when set,
// says where the CLI is, and cluster-down.sh stops what it started. The
// directory it writes to by default is ignored by git.
func TestClusterUpPorts(t *testing.T) {
	bin := sluiceBinary(t)
	gitignore, err := os.ReadFile("../../.gitignore")
	if err != nil || !strings.Contains("\n"+string(gitignore), "\nsluice-cluster/\n") {
		t.Errorf(".gitignore (%v) lacks sluice-cluster/:\n%s", err, gitignore)
	}

	// Node 1 gets gRPC on base+11 and HTTP on base+10.
	grpcPort := freePortPair(t) + 1
	gossipPort := clustertest.FreePort(t)
	dir := t.TempDir()
	script := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command("bash", append([]string{filepath.Join("..", "..", "scripts", name)}, args...)...)
		cmd.Env = append(os.Environ(),
			"SLUICE_CLUSTER_DIR="+dir,
			"SLUICE_CLUSTER_BIN="+bin,
			"SLUICE_CLUSTER_PORT_BASE="+strconv.Itoa(grpcPort-11),
			"SLUICE_CLUSTER_GOSSIP_BASE="+strconv.Itoa(gossipPort-1),
			"SLUICE_CLUSTER_FLAGS=--durability memory --actors 2")
		out, err := cmd.CombinedOutput()
		if err != nil {
			logs, _ := os.ReadFile(filepath.Join(dir, "node-1", "log"))
			t.Fatalf("%s %s: %v\n%s\nnode log:\n%s", name, strings.Join(args, " "), err, out, logs)
		}
		return string(out)
	}
	t.Cleanup(func() { script("cluster-down.sh") })
	out := script("cluster-up.sh", "1")

	info, err := waitReadyFile(filepath.Join(dir, "node-1", "ready.json"), make(chan int), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wantGRPC, wantHTTP := "127.0.0.1:"+strconv.Itoa(grpcPort), "127.0.0.1:"+strconv.Itoa(grpcPort-1)
	if info.GRPCAddr != wantGRPC || info.HTTPAddr != wantHTTP {
		t.Errorf("cluster-up.sh with port base %d: node-1 serves gRPC on %s, HTTP on %s; want %s, %s", grpcPort-11, info.GRPCAddr, info.HTTPAddr, wantGRPC, wantHTTP)
	}
	if !strings.Contains(out, "gRPC "+wantGRPC) || !strings.Contains(out, "the CLI: "+bin) {
		t.Errorf("cluster-up.sh printed\n%s\nwant node-1's gRPC address %s and the CLI %s", out, wantGRPC, bin)
	}
	r := mustRun(t, exitOK, nil, "members", "--addr", info.GRPCAddr)
	if !strings.Contains(r.stdout, "node-1") || !strings.Contains(r.stdout, "127.0.0.1:"+strconv.Itoa(gossipPort)) {
		t.Errorf("members of the scripted node printed\n%s\nwant node-1 gossiping on port %d", r.stdout, gossipPort)
	}
}

// freePortPair returns a port p such that p and p+1 are free on
// 127.0.0.1 now: the scripts take a base port and use the next ones.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 20 {
		p := clustertest.FreePort(t)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no two free ports in a row")
	return 0
}

// TestBenchScripts runs scripts/bench-compare and scripts/bench-keys for a
// second on the built binary and checks that they still read what sluice
// bench and the node print: they parse its text report and /proc, so a
// renamed row or flag would otherwise turn the next comparison of two
// builds into zeros without a word. The figures themselves are not
// checked, only that every one of them was measured.
func TestBenchScripts(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the bench scripts read /proc: Linux only")
	}
	bin := sluiceBinary(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, script string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "scripts", script), args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	t.Run("bench-compare", func(t *testing.T) {
		out := run(t, "bench-compare", "-r", "1", "-d", "1s", "-k", "100", "-c", "8", "-p", strconv.Itoa(freePortPair(t)), bin, bin)
		// A round's line: round, build, then rate, p99, errors, CPU and
		// system calls for one check per call and for ten.
		rounds := regexp.MustCompile(`(?m)^1\s+([AB])\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$`).FindAllStringSubmatch(out, -1)
		if len(rounds) != 2 {
			t.Fatalf("want a line for A and one for B in round 1:\n%s", out)
		}
		for _, m := range rounds {
			for i, v := range m[2:] {
				f, err := strconv.ParseFloat(v, 64)
				isErrors := i == 2 || i == 7
				switch {
				case err != nil:
					t.Errorf("build %s, column %d: %q is not a number:\n%s", m[1], i+3, v, out)
				case isErrors && f != 0:
					t.Errorf("build %s: %v failed calls:\n%s", m[1], f, out)
				case !isErrors && f <= 0:
					t.Errorf("build %s, column %d: %v; want a measured figure above 0:\n%s", m[1], i+3, f, out)
				}
			}
		}
		for _, measure := range []string{"b1 calls/s", "b1 p99 ms", "b1 cpu us/decision", "b1 syscalls/decision",
			"b10 decisions/s", "b10 p99 ms", "b10 cpu us/decision", "b10 syscalls/decision"} {
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(measure) + `\s+([0-9.e+]+)\s+([0-9.e+]+)\s+([0-9.]+)\s+[01] of 1$`)
			m := re.FindStringSubmatch(out)
			if m == nil {
				t.Errorf("no summary line for %q:\n%s", measure, out)
				continue
			}
			if ratio, _ := strconv.ParseFloat(m[3], 64); ratio <= 0 {
				t.Errorf("%s: median B/A %s; want above 0", measure, m[3])
			}
		}
	})

	t.Run("bench-keys", func(t *testing.T) {
		out := run(t, "bench-keys", "-k", "100", "-r", "1", "-d", "1s", "-c", "8", "-n", "-p", strconv.Itoa(freePortPair(t)), bin)
		_, summary, ok := strings.Cut(out, "medians:\n")
		m := regexp.MustCompile(`keys=100 decisions/s=([0-9.]+) p99=([0-9.]+)ms node_cpu=([0-9.]+)us/decision anon_peak=([0-9]+)MiB`).FindStringSubmatch(summary)
		if !ok || m == nil {
			t.Fatalf("no median line for 100 keys:\n%s", out)
		}
		for i, name := range []string{"decisions/s", "p99", "node_cpu", "anon_peak"} {
			if f, _ := strconv.ParseFloat(m[i+1], 64); f <= 0 {
				t.Errorf("%s=%s; want a measured figure above 0:\n%s", name, m[i+1], out)
			}
		}
	})
}
