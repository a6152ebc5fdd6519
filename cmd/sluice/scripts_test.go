//go:build unix

package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

	// Node 1 gets gRPC on base+11 and HTTP on base+10: find two free
	// ports in a row.
	var grpcPort int
	for range 20 {
		p := clustertest.FreePort(t)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p-1)); err == nil {
			l.Close()
			grpcPort = p
			break
		}
	}
	if grpcPort == 0 {
		t.Fatal("no two free ports in a row")
	}
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
