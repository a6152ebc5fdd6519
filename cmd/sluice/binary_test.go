//go:build unix

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// proc is "sluice serve" run from the built binary.
type proc struct {
	t        *testing.T
	cmd      *exec.Cmd
	logs     *testkit.SyncBuffer
	exited   chan struct{} // closed once the process has exited
	grpcAddr string
	httpAddr string
}

// startProc starts the binary's serve on dataDir with addresses on port 0,
// then args, and waits until it serves. The test's end kills it if it is
// still running.
func startProc(t *testing.T, dataDir string, args ...string) *proc {
	t.Helper()
	bin := sluiceBinary(t)
	ready := filepath.Join(t.TempDir(), "ready.json")
	p := &proc{t: t, logs: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"serve",
		"--grpc-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0",
		"--data-dir", dataDir,
		"--ready-file", ready,
		"--node-name", "proc",
	}, args...)...)
	p.cmd.Env = []string{} // no SLUICE_ variable of the test's environment
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("sluice serve output:\n%s", p.logs)
		}
	})
	info, err := waitReadyFile(ready, p.exited, 20*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", p.cmd, err)
	}
	p.grpcAddr, p.httpAddr = info.GRPCAddr, info.HTTPAddr
	return p
}

// signal sends sig to the process.
func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits up to timeout for the process to exit and returns its exit
// code, -1 if a signal ended it.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("sluice serve still running %v later", timeout)
		return 0
	}
}

// used returns how many hits key holds, from the CLI's key get -o json.
func used(t *testing.T, addr, key string) int64 {
	t.Helper()
	r := mustRun(t, exitOK, nil, "key", "get", key, "--addr", addr, "-o", "json")
	var got sluicepb.GetKeyResponse
	decodeJSON(t, r.stdout, &got)
	return got.State.Used
}

// TestBinaryNoFreeWindow: no free window after a restart. Hits acknowledged
// by a node are still counted after it restarts on the same data dir,
// whether it was stopped with SIGTERM (and exited 0) or killed with
// SIGKILL in the default durability mode.
func TestBinaryNoFreeWindow(t *testing.T) {
	t.Parallel()
	const hits = 5
	for _, tc := range []struct {
		name     string
		sig      os.Signal
		wantCode int // -1: ended by the signal
	}{
		{"SIGTERM", syscall.SIGTERM, 0},
		{"SIGKILL", syscall.SIGKILL, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dataDir := t.TempDir()
			p := startProc(t, dataDir)
			for i := range hits {
				r := mustRun(t, exitOK, nil, "check", "--addr", p.grpcAddr, "user:42", "--limit", "100", "--window", "1h")
				if row := tableRows(t, r.stdout)[0]; row["REMAINING"] != itoa(100-i-1) {
					t.Fatalf("hit %d: remaining %s; want %d", i+1, row["REMAINING"], 100-i-1)
				}
			}
			p.signal(tc.sig)
			if code := p.wait(15 * time.Second); code != tc.wantCode {
				t.Fatalf("after %s, sluice serve exited with code %d; want %d", tc.name, code, tc.wantCode)
			}

			p = startProc(t, dataDir)
			if got := used(t, p.grpcAddr, "user:42"); got != hits {
				t.Errorf("after %s and a restart, user:42 holds %d hits; want the %d acknowledged before", tc.name, got, hits)
			}
			r := mustRun(t, exitOK, nil, "check", "--addr", p.grpcAddr, "user:42", "--limit", "100", "--window", "1h", "--peek")
			if row := tableRows(t, r.stdout)[0]; row["REMAINING"] != itoa(100-hits) {
				t.Errorf("peek after the restart: remaining %s; want %d", row["REMAINING"], 100-hits)
			}
			p.signal(syscall.SIGTERM)
			if code := p.wait(15 * time.Second); code != 0 {
				t.Errorf("sluice serve exited with code %d after SIGTERM; want 0", code)
			}
		})
	}
}

// TestBinarySecondSignal: a node whose graceful stop waits for a call in
// flight exits at once, with 128+15, on a second SIGTERM; with a single
// SIGTERM it cuts the call after --shutdown-timeout and exits 0.
//
// The call in flight is a grpc health Watch stream, which stays open until
// the client ends it; its switch to NOT_SERVING tells the test,
// deterministically, that the shutdown has begun.
func TestBinarySecondSignal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		shutdownTimeout string
		signals         int
		wantCode        int
		within          time.Duration
	}{
		{"second signal", "1m", 2, 128 + int(syscall.SIGTERM), 10 * time.Second},
		{"shutdown timeout", "300ms", 1, 0, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startProc(t, t.TempDir(), "--shutdown-timeout", tc.shutdownTimeout)
			conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := watch.Recv(); err != nil || got.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health Watch: %v, %v; want SERVING", got, err)
			}
			p.signal(syscall.SIGTERM)
			if got, err := watch.Recv(); err != nil || got.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Fatalf("health Watch after SIGTERM: %v, %v; want NOT_SERVING", got, err)
			}
			start := time.Now()
			if tc.signals == 2 {
				p.signal(syscall.SIGTERM)
			}
			if code := p.wait(tc.within); code != tc.wantCode {
				t.Errorf("sluice serve exited with code %d; want %d", code, tc.wantCode)
			}
			if tc.signals == 2 {
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("exit took %v after the second signal; want at once", d)
				}
				if !strings.Contains(p.logs.String(), "sluice: second SIGTERM: exiting without finishing the shutdown") {
					t.Errorf("output:\n%s\nwant a line about the second signal", p.logs)
				}
			}
		})
	}
}
