package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestMeasureStalledStreams measures what clients that open streams and
// never read the answers cost a node: 4 connections (or
// SLUICE_MEASURE_STREAM_CONNS) that announce a flow
// control window of 0 bytes, never read from the socket, and between them
// try SLUICE_MEASURE_STREAMS native calls, each a HEADERS and a DATA
// frame, of one check (a peek) or SLUICE_MEASURE_CHECKS checks on as many
// keys. A connection stops when a write blocks for 5
// s. The node is the built binary in memory mode, plus the serve flags in
// SLUICE_MEASURE_FLAGS; the test logs its memory (/proc: RSS, its peak,
// anonymous RSS; its Go heap and goroutines through --pprof) before,
// while the connections are open (once the heap stopped growing, and
// after a forced garbage collection: what the node holds live); then
// how long the node takes to close the stalled connections (up to 90 s,
// reading but never answering its pings); then its memory 5 s after they
// closed, after a forced garbage collection, after a second one, and 30 s
// after they closed (SLUICE_MEASURE_PROFILE=<file> saves a heap profile
// while they are open; with SLUICE_MEASURE_MAX_ANON_MIB=<n> it fails if
// the node's anonymous RSS reached n MiB while they were open):
//
//	SLUICE_MEASURE_STREAMS=200000 go test ./cmd/sluice/ -run MeasureStalledStreams -v
//
// The attack of issue 21 (16 connections × 500 streams × 500 checks):
//
//	SLUICE_MEASURE_STREAMS=8000 SLUICE_MEASURE_STREAM_CONNS=16 SLUICE_MEASURE_CHECKS=500 \
//	SLUICE_MEASURE_MAX_ANON_MIB=256 go test ./cmd/sluice/ -run MeasureStalledStreams -v
func TestMeasureStalledStreams(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_STREAMS"))
	if total == 0 {
		t.Skip("set SLUICE_MEASURE_STREAMS=<streams> to measure")
	}
	conns := 4
	if n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_STREAM_CONNS")); n > 0 {
		conns = n
	}
	p := startProc(t, t.TempDir(), append([]string{"--durability", "memory", "--pprof"}, strings.Fields(os.Getenv("SLUICE_MEASURE_FLAGS"))...)...)
	mustRun(t, exitOK, nil, "check", "measure", "--limit", "1000000000", "--window", "1m", "--addr", p.grpcAddr)
	pid := p.cmd.Process.Pid
	maxAnon := int64(0) // the most anonymous RSS seen while the connections are open, KiB
	report := func(when string, gc bool) int64 {
		t.Helper()
		st := procStatus(t, pid)
		maxAnon = max(maxAnon, st["RssAnon"])
		heap, goroutines := goMemory(t, p.httpAddr, gc)
		t.Logf("%-36s RSS %4d MB (peak %4d MB), anonymous %4d MB; Go heap in use %4d MB; %6d goroutines",
			when, st["VmRSS"]>>10, st["VmHWM"]>>10, st["RssAnon"]>>10, heap>>20, goroutines)
		return heap
	}
	report("before", false)

	req := &sluicepb.CheckRequest{}
	perCall := 1
	if n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_CHECKS")); n > 0 {
		perCall = n
	}
	for i := range perCall {
		req.Checks = append(req.Checks, apitest.Check(fmt.Sprintf("measure:%d", i), 1000000000, time.Minute, 0))
	}
	body, err := apitest.GRPCMessage(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("each call: %d checks, %d bytes", perCall, len(body))
	began := time.Now()
	var wg sync.WaitGroup
	sent := make([]int, conns)
	ends := make([]error, conns)
	hs := make([]*apitest.H2Conn, conns)
	for i := range conns {
		c, err := apitest.DialH2(p.grpcAddr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = c
		defer c.Close()
		wg.Go(func() {
			w := bufio.NewWriterSize(c.Conn, 64<<10)
			c.Framer = http2.NewFramer(w, c.Conn)
			for sent[i] < total/conns {
				if _, err := c.Call("/sluice.v1.RateLimitService/Check", body); err != nil {
					ends[i] = err
					return
				}
				sent[i]++
				if sent[i]%256 == 0 {
					c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
					if err := w.Flush(); err != nil {
						ends[i] = err
						return
					}
				}
			}
			c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			ends[i] = w.Flush()
		})
	}
	wg.Wait()
	for i := range conns {
		end := "all written"
		var ne net.Error
		switch err := ends[i]; {
		case errors.As(err, &ne) && ne.Timeout():
			end = "writes blocked 5 s"
		case err != nil:
			end = "closed by the node: " + err.Error()
		}
		t.Logf("connection %d: %d streams sent (%s)", i, sent[i], end)
	}
	t.Logf("sending took %v", time.Since(began).Round(time.Millisecond))
	// Let the node take in what is queued: until its heap stops growing.
	for prev, deadline := int64(-1), time.Now().Add(time.Minute); ; {
		maxAnon = max(maxAnon, procStatus(t, pid)["RssAnon"])
		heap, _ := goMemory(t, p.httpAddr, false)
		if heap-prev < 1<<20 || time.Now().After(deadline) {
			break
		}
		prev = heap
		time.Sleep(time.Second) // not a poll: "settled" is under 1 MiB of growth in a second
	}
	report("connections open, heap settled", false)
	if resp, err := http.Get("http://" + p.httpAddr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "sluice_request_budget_") || strings.HasPrefix(line, "sluice_decisions_total") {
				t.Logf("node metric: %s", line)
			}
		}
	}
	if path := os.Getenv("SLUICE_MEASURE_PROFILE"); path != "" {
		saveHeapProfile(t, p.httpAddr, path)
	}
	report("then after a forced GC", true)
	if limit, _ := strconv.ParseInt(os.Getenv("SLUICE_MEASURE_MAX_ANON_MIB"), 10, 64); limit > 0 && maxAnon>>10 >= limit {
		t.Errorf("anonymous RSS reached %d MiB while the connections were open; want under SLUICE_MEASURE_MAX_ANON_MIB=%d", maxAnon>>10, limit)
	}
	// How long until the node drops the stalled connections (keepalive):
	// read what it sent until it closes them, answering nothing.
	settled := time.Now()
	for i, c := range hs {
		wg.Go(func() {
			c.Conn.SetReadDeadline(settled.Add(90 * time.Second))
			_, err := io.Copy(io.Discard, c.Conn)
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Logf("connection %d: still open 90 s later", i)
				return
			}
			t.Logf("connection %d: closed by the node %v later (%v)", i, time.Since(settled).Round(100*time.Millisecond), err)
		})
	}
	wg.Wait()
	for _, c := range hs {
		c.Close()
	}
	closed := time.Now()
	time.Sleep(5 * time.Second) // not a poll: the measurement is taken 5 s after
	report("5 s after the client left", false)
	report("then after a forced GC", true)
	report("and a second one", true)                     // sync.Pools empty in two
	time.Sleep(time.Until(closed.Add(30 * time.Second))) // not a poll: and 30 s after
	report("30 s after the client left", false)
}

// procStatus reads the kB fields of /proc/pid/status.
func procStatus(t *testing.T, pid int) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			out[name], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return out
}

var (
	heapInuseRE  = regexp.MustCompile(`(?m)^# HeapInuse = (\d+)$`)
	goroutinesRE = regexp.MustCompile(`^goroutine profile: total (\d+)`)
)

// goMemory asks a node served with --pprof for its Go heap in use, in
// bytes (after a garbage collection if gc), and its number of goroutines.
func goMemory(t *testing.T, httpAddr string, gc bool) (heap, goroutines int64) {
	t.Helper()
	get := func(path string, re *regexp.Regexp) int64 {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindSubmatch(b)
		if m == nil {
			t.Fatalf("GET %s: no %v in the answer", path, re)
		}
		n, _ := strconv.ParseInt(string(m[1]), 10, 64)
		return n
	}
	heapPath := "/debug/pprof/heap?debug=1"
	if gc {
		heapPath += "&gc=1"
	}
	return get(heapPath, heapInuseRE), get("/debug/pprof/goroutine?debug=1", goroutinesRE)
}

// saveHeapProfile writes the heap profile of a node served with --pprof
// to path, for go tool pprof.
func saveHeapProfile(t *testing.T, httpAddr, path string) {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/debug/pprof/heap")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("heap profile in %s", path)
}

// TestMeasureIdleConnections measures what idle connections cost a node:
// SLUICE_MEASURE_CONNS connections that finish the HTTP/2 handshake and
// make one call each, then stay open, answering the node's pings. The
// node is the built binary in memory mode, plus the serve flags in
// SLUICE_MEASURE_FLAGS:
//
//	SLUICE_MEASURE_CONNS=2000 go test ./cmd/sluice/ -run MeasureIdleConnections -v
func TestMeasureIdleConnections(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_CONNS"))
	if n == 0 {
		t.Skip("set SLUICE_MEASURE_CONNS=<connections> to measure")
	}
	p := startProc(t, t.TempDir(), append([]string{"--durability", "memory", "--pprof"}, strings.Fields(os.Getenv("SLUICE_MEASURE_FLAGS"))...)...)
	// A clustered node (SLUICE_MEASURE_FLAGS="--gossip-addr 127.0.0.1:0
	// --expect 1") decides once it has bootstrapped its cluster.
	var r result
	testkit.Eventually(t, 30*time.Second, func() bool {
		r = runCLI(t, nil, "check", "measure", "--limit", "1000000000", "--window", "1m", "--addr", p.grpcAddr)
		return r.code == exitOK
	}, "the node did not decide: %v", &r)
	pid := p.cmd.Process.Pid
	sample := func() (rss, anon, heap, goroutines int64) {
		st := procStatus(t, pid)
		heap, goroutines = goMemory(t, p.httpAddr, true)
		return st["VmRSS"] << 10, st["RssAnon"] << 10, heap, goroutines
	}
	rss0, anon0, heap0, g0 := sample()
	body, err := apitest.GRPCMessage(&sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check("measure", 1000000000, time.Minute, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var hs []*apitest.H2Conn
	defer func() {
		for _, c := range hs {
			c.Close()
		}
		wg.Wait()
	}()
	opened := 0
	for range n {
		c, err := apitest.DialH2(p.grpcAddr)
		if err != nil {
			t.Logf("connection %d: %v", opened, err)
			break
		}
		hs = append(hs, c)
		if _, err := c.ServerSettings(10 * time.Second); err != nil {
			t.Logf("connection %d not served: %v", opened, err)
			break
		}
		if _, err := c.Call("/sluice.v1.RateLimitService/Check", body); err != nil {
			t.Fatal(err)
		}
		opened++
		wg.Go(func() { c.Closed(time.Hour, true) }) // read the answer, ack pings
	}
	time.Sleep(3 * time.Second) // not a poll: the connections settle for a fixed time before the measurement
	rss, anon, heap, g := sample()
	per := func(after, before int64) int64 { return (after - before) / int64(max(opened, 1)) }
	t.Logf("%d connections open: RSS +%d MB, anonymous +%d MB, Go heap +%d MB, +%d goroutines: per connection %d KB RSS, %d KB anonymous, %d KB heap, %.1f goroutines",
		opened, (rss-rss0)>>20, (anon-anon0)>>20, (heap-heap0)>>20, g-g0, per(rss, rss0)>>10, per(anon, anon0)>>10, per(heap, heap0)>>10, float64(g-g0)/float64(max(opened, 1)))
}
