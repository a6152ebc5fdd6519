package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestMain checks for leaked goroutines after the tests, and removes the
// built binaries.
func TestMain(m *testing.M) {
	code := clustertest.RunParallel(m, 4)
	for _, dir := range []string{sluiceBin.dir, helmRenderer.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

// env is a fake environment for run.
type env map[string]string

func (e env) get(name string) string { return e[name] }

// result is what one run of the CLI did.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCLI runs the command line args in-process with the environment e.
func runCLI(t testing.TB, e env, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, &stdout, &stderr, e.get)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// mustRun runs args and fails the test unless the exit code is want.
func mustRun(t testing.TB, want int, e env, args ...string) result {
	t.Helper()
	r := runCLI(t, e, args...)
	if r.code != want {
		t.Fatalf("sluice %s: %v; want exit code %d", strings.Join(args, " "), r, want)
	}
	return r
}

// decodeJSON reads the protojson output of a command into m.
func decodeJSON(t testing.TB, out string, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("output is not a %T in JSON: %v\n%s", m, err, out)
	}
}

// cliNode is a "sluice serve" running in-process, through run, on 127.0.0.1
// port 0.
type cliNode struct {
	t        testing.TB
	dataDir  string
	grpcAddr string
	httpAddr string
	// peerAddr and adminAddr are those of the ready file: set when the
	// service has a listener of its own.
	peerAddr, adminAddr string
	healthAddr          string // set with --health-addr
	logs                *testkit.SyncBuffer
	cancel              context.CancelFunc
	done                chan int
	stopped             bool
}

// startNode runs "sluice serve" with a data dir in t.TempDir(), addresses
// on port 0 and a ready file, then args (later flags win), in the
// environment e. It returns once the node serves; the node stops at the end
// of the test, which fails unless it exits 0.
func startNode(t testing.TB, e env, args ...string) *cliNode {
	t.Helper()
	dir := t.TempDir()
	n := &cliNode{t: t, dataDir: filepath.Join(dir, "data"), logs: &testkit.SyncBuffer{}, done: make(chan int, 1)}
	ready := filepath.Join(dir, "ready.json")
	full := append([]string{"serve",
		"--grpc-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0",
		"--data-dir", n.dataDir,
		"--ready-file", ready,
		"--actors", "4",
	}, args...)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { n.done <- run(ctx, full, io.Discard, n.logs, e.get) }()
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			t.Logf("node logs:\n%s", n.logs)
		}
	})
	info, err := waitReadyFile(ready, n.done, 10*time.Second)
	if err != nil {
		t.Fatalf("sluice %s: %v", strings.Join(full, " "), err)
	}
	n.grpcAddr, n.httpAddr = info.GRPCAddr, info.HTTPAddr
	n.peerAddr, n.adminAddr = info.PeerAddr, info.AdminAddr
	n.healthAddr = info.HealthAddr
	return n
}

// waitReadyz waits until the node's /readyz answers 200: a cluster node
// serves (its ready file is written) before it holds a lease.
func (n *cliNode) waitReadyz() {
	n.t.Helper()
	if err := testkit.Wait(20*time.Second, func() error {
		resp, err := http.Get("http://" + n.httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		n.t.Fatalf("node at %s not ready: %v", n.grpcAddr, err)
	}
}

// stop ends the node as a first SIGINT would and checks that it exits 0.
func (n *cliNode) stop() {
	n.t.Helper()
	if n.stopped {
		return
	}
	n.stopped = true
	n.cancel()
	select {
	case code := <-n.done:
		if code != exitOK {
			n.t.Errorf("serve exited with code %d after a graceful stop; want 0", code)
		}
	case <-time.After(20 * time.Second):
		n.t.Errorf("serve did not stop within 20s of its context ending")
	}
}

// waitReadyFile polls for the ready file of serve until it appears, the
// process ends (exited receives its exit code) or timeout passes.
func waitReadyFile[T any](path string, exited <-chan T, timeout time.Duration) (readyInfo, error) {
	var info readyInfo
	var final error // an answer that ends the wait: no use polling on
	err := testkit.Wait(timeout, func() error {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			if err := json.Unmarshal(b, &info); err != nil {
				final = fmt.Errorf("ready file %s: %v", path, err)
			}
			return nil
		case !errors.Is(err, os.ErrNotExist):
			final = err
			return nil
		}
		select {
		case code := <-exited:
			final = fmt.Errorf("serve exited (%v) before it was ready", code)
			return nil
		default:
			return errors.New("no ready file")
		}
	})
	if final != nil {
		return readyInfo{}, final
	}
	return info, err
}

// built is a binary the tests build once per test binary; TestMain
// removes it.
type built struct {
	once      sync.Once
	dir, path string
	err       error
}

// build builds the main package in src as name, once (with -race when the
// tests run with it, so that the build reuses their compiled packages),
// and returns its path.
func (b *built) build(src, name string) (string, error) {
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "sluice-test-"+name+"-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, name)
		args := []string{"build", "-o", b.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, ".")...)
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", src, err, out)
		}
	})
	return b.path, b.err
}

// sluiceBin is the sluice binary, built by sluiceBinary.
var sluiceBin built

// sluiceBinary builds the sluice binary and returns its path. It skips
// the test under -short.
func sluiceBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the sluice binary; skipped with -short")
	}
	path, err := sluiceBin.build(".", "sluice")
	if err != nil {
		t.Fatal(err)
	}
	return path
}
