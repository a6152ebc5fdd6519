//go:build unix

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestBinaryEdgeSIGTERM: the sluice edge binary, on SIGTERM, stops
// accepting, lets the request in flight reach the origin and come back,
// and exits 0.
func TestBinaryEdgeSIGTERM(t *testing.T) {
	t.Parallel()
	bin := sluiceBinary(t)
	n := startNode(t, env{})
	release := make(chan struct{})
	var arrived atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			// The probes of the listener after SIGTERM: one that gets in
			// before the listener closes must not wait for release.
			fmt.Fprint(w, "ok")
			return
		}
		arrived.Add(1)
		<-release
		fmt.Fprint(w, "done")
	}))
	defer origin.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	ready := filepath.Join(t.TempDir(), "ready.json")
	logs := &testkit.SyncBuffer{}
	cmd := exec.Command(bin, "edge", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--ready-file", ready,
		"--origin", origin.URL, "--sluice", n.grpcAddr, "--key", "ip", "--limit", "100", "--window", "1m", "--decision-timeout", "5s")
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("sluice edge output:\n%s", logs)
		}
	})
	var info edgeReady
	if err := testkit.Wait(20*time.Second, func() error {
		b, err := os.ReadFile(ready)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("no ready file: %v", err)
		}
		if err == nil {
			err = json.Unmarshal(b, &info) // a file half written
		}
		return err
	}); err != nil {
		t.Fatalf("no ready file: %v", err)
	}

	type result struct {
		status int
		body   string
		err    error
	}
	// No connection outlives its request: none is left when the test ends.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	inflight := make(chan result, 1)
	go func() {
		resp, err := hc.Get("http://" + info.Listen + "/slow")
		if err != nil {
			inflight <- result{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		inflight <- result{status: resp.StatusCode, body: string(b)}
	}()
	testkit.Eventually(t, 10*time.Second, func() bool { return arrived.Load() > 0 }, "the request to reach the origin")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() bool {
		resp, err := hc.Get("http://" + info.Listen + "/")
		if err != nil {
			return true // the listener is closed
		}
		resp.Body.Close()
		return false
	}, "the edge to stop accepting connections after SIGTERM")
	close(release)
	if r := <-inflight; r.err != nil || r.status != 200 || r.body != "done" {
		t.Errorf("the request in flight at SIGTERM got %d %q %v; want 200 done", r.status, r.body, r.err)
	}
	select {
	case <-exited:
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("sluice edge exited with %d after SIGTERM; want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("sluice edge still running 15s after SIGTERM")
	}
}
