//go:build linux

package edge

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/sluice-io/sluice/cmd/sluice/node"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// The figures of docs/edge.md, measured on loopback with everything in
// this process: an origin, a Sluice node (default durability, a data file
// in a temporary directory), sluice edge and a plain
// httputil.ReverseProxy in front of the same origin, and the load.
//
//	SLUICE_EDGE_FIGURES=1 go test ./cmd/sluice/edge -run TestFigures -v -timeout 30m
//
// SLUICE_EDGE_FIGURES_ROUNDS (default 3) and SLUICE_EDGE_FIGURES_SECONDS
// (default 3, per measurement) tune it. SLUICE_EDGE_FIGURES_SLUICE=ADDR
// uses the Sluice node at ADDR (sluice serve, pinned to its own CPU)
// instead of one in this process, for the overhead and cache figures, and
// SLUICE_EDGE_FIGURES_SLUICE_PID=PID reads its CPU time from /proc.
// Skipped without SLUICE_EDGE_FIGURES.
//
// The figures of docs/edge.md were taken with Sluice on CPU 0 and
// everything else on CPU 1:
//
//	go build -o /tmp/sluice ./cmd/sluice && go test -c -o /tmp/edge.test ./cmd/sluice/edge
//	taskset -c 0 /tmp/sluice serve --data-dir /tmp/edge-fig --grpc-addr 127.0.0.1:19381 --http-addr 127.0.0.1:19380 &
//	SLUICE_EDGE_FIGURES=1 SLUICE_EDGE_FIGURES_SLUICE=127.0.0.1:19381 SLUICE_EDGE_FIGURES_SLUICE_PID=$! \
//	  taskset -c 1 /tmp/edge.test -test.run TestFigures -test.v

func figuresEnabled(t *testing.T) (rounds int, d time.Duration) {
	if os.Getenv("SLUICE_EDGE_FIGURES") == "" {
		t.Skip("set SLUICE_EDGE_FIGURES=1 to measure the figures of docs/edge.md")
	}
	rounds, d = 3, 3*time.Second
	if v, err := strconv.Atoi(os.Getenv("SLUICE_EDGE_FIGURES_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	if v, err := strconv.Atoi(os.Getenv("SLUICE_EDGE_FIGURES_SECONDS")); err == nil && v > 0 {
		d = time.Duration(v) * time.Second
	}
	return rounds, d
}

// loadClient is the HTTP client of the load: keep-alive, enough idle
// connections for every worker.
func loadClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	return &http.Client{Transport: tr}
}

// loadResult is what one run of load measured.
type loadResult struct {
	rate           float64 // answers per second
	p50, p99, p999 time.Duration
	statuses       map[int]int64
}

// request sends one GET with an API key, drains the answer and returns its
// status (0 on an error).
func request(c *http.Client, target, key string) int {
	req, _ := http.NewRequest("GET", target, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// closedLoop runs workers that each send a request and wait for it, for d:
// the saturation throughput.
func closedLoop(c *http.Client, target string, keys []string, workers int, d time.Duration) loadResult {
	var n atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int64{}
	h := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			local := map[int]int64{}
			lh := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
			for time.Now().Before(stop) {
				start := time.Now()
				local[request(c, target, keys[r.IntN(len(keys))])]++
				lh.RecordValue(int64(time.Since(start) / time.Microsecond))
				n.Add(1)
			}
			mu.Lock()
			for k, v := range local {
				statuses[k] += v
			}
			h.Merge(lh)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return loadResult{rate: float64(n.Load()) / d.Seconds(), statuses: statuses,
		p50: us(h.ValueAtQuantile(50)), p99: us(h.ValueAtQuantile(99)), p999: us(h.ValueAtQuantile(99.9))}
}

// selfCPU is the CPU time this process used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the CPU time process pid used so far (0 if pid is 0 or
// unreadable), from /proc at 100 ticks a second.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func us(v int64) time.Duration { return time.Duration(v) * time.Microsecond }

// wakeAt waits until due and returns when the request's latency counts
// from: due if it is already past (a late request counts its wait, so
// queueing shows), else when the sleep ended. A sleeping worker wakes up to
// a millisecond late in an idle process, a delay of the load's, not of
// what it measures (as in sluice bench's open loop).
func wakeAt(due time.Time) time.Time {
	wait := time.Until(due)
	if wait <= 0 {
		return due
	}
	time.Sleep(wait) // not a poll: an open loop sends each request at its time
	return time.Now()
}

// openLoop sends requests at rate per second for d, whatever the answers
// take, and measures each from its scheduled time (so queueing shows), or
// from when its waiting worker woke (wakeAt).
func openLoop(c *http.Client, target string, keys []string, rate float64, d time.Duration) loadResult {
	total := int64(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int64{}
	h := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	for w := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			local := map[int]int64{}
			lh := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
			for {
				i := next.Add(1) - 1
				if i >= total {
					break
				}
				from := wakeAt(start.Add(time.Duration(i) * interval))
				local[request(c, target, keys[r.IntN(len(keys))])]++
				lh.RecordValue(int64(time.Since(from) / time.Microsecond))
			}
			mu.Lock()
			for k, v := range local {
				statuses[k] += v
			}
			h.Merge(lh)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return loadResult{rate: float64(total) / time.Since(start).Seconds(), statuses: statuses,
		p50: us(h.ValueAtQuantile(50)), p99: us(h.ValueAtQuantile(99)), p999: us(h.ValueAtQuantile(99.9))}
}

// pairedOpenLoop is openLoop on two targets at once: the scheduled
// requests alternate between a and b, so that both see the same machine
// at the same moments; rate is the total.
func pairedOpenLoop(c *http.Client, a, b string, keys []string, rate float64, d time.Duration) (ra, rb loadResult) {
	total := int64(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := [2]map[int]int64{{}, {}}
	var hs [2]*hdrhistogram.Histogram
	for i := range hs {
		hs[i] = hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	}
	for w := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 3))
			local := [2]map[int]int64{{}, {}}
			var lh [2]*hdrhistogram.Histogram
			for i := range lh {
				lh[i] = hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
			}
			for {
				i := next.Add(1) - 1
				if i >= total {
					break
				}
				from := wakeAt(start.Add(time.Duration(i) * interval))
				which, target := i%2, a
				if which == 1 {
					target = b
				}
				local[which][request(c, target, keys[r.IntN(len(keys))])]++
				lh[which].RecordValue(int64(time.Since(from) / time.Microsecond))
			}
			mu.Lock()
			for j := range 2 {
				for k, v := range local[j] {
					statuses[j][k] += v
				}
				hs[j].Merge(lh[j])
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	res := func(j int) loadResult {
		return loadResult{rate: float64(total) / 2 / el, statuses: statuses[j],
			p50: us(hs[j].ValueAtQuantile(50)), p99: us(hs[j].ValueAtQuantile(99)), p999: us(hs[j].ValueAtQuantile(99.9))}
	}
	return res(0), res(1)
}

// figureSetup is an origin, a Sluice node, an edge and a plain proxy.
type figureSetup struct {
	edge, plain string
	e           *Edge
	node        *nodetest.Node
}

func newFigureSetup(t *testing.T, rules *RulesFile, edit func(*Config)) *figureSetup {
	originSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the origin\n")
	}))
	t.Cleanup(originSrv.Close)
	sluice := os.Getenv("SLUICE_EDGE_FIGURES_SLUICE")
	var n *nodetest.Node
	if sluice == "" {
		dataDir := t.TempDir()
		n = nodetest.Start(t, "n1", func(c *node.Config) {
			c.Durability, c.DataDir = "commit", dataDir
			c.Engine.Actors = 0
		})
		sluice = n.Addr
	}
	e := startEdge(t, originSrv.URL, sluice, func(c *Config) {
		c.Rules = rules
		c.KeyPrefix = fmt.Sprintf("fig%d|", time.Now().UnixNano()) // fresh keys on a node that outlives the run
		c.Client.Timeout = 20 * time.Millisecond                   // the default
		if edit != nil {
			edit(c)
		}
	})
	u, _ := url.Parse(originSrv.URL)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 256, 256
	plain := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() },
		Transport: tr,
	})
	t.Cleanup(plain.Close)
	return &figureSetup{edge: "http://" + e.Addr() + "/", plain: plain.URL + "/", e: e, node: n}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianDur(xs []time.Duration) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestFiguresOverhead: what the edge adds to a plain reverse proxy in
// front of the same origin: saturation throughput (closed loop, 64
// workers, one proxy then the other) and p50 and p99 latency under an
// open-loop load of half the edge's saturation, its requests alternating
// between the two proxies, so that both see the same machine at the same
// moments. 10,000 API keys, a
// limit that never denies: the allowed path, one Sluice check per request.
func TestFiguresOverhead(t *testing.T) {
	rounds, d := figuresEnabled(t)
	s := newFigureSetup(t, oneRule("header:X-API-Key", 1_000_000_000, "1m", ""), nil)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	c := loadClient()
	closedLoop(c, s.edge, keys, 64, time.Second) // warm up both
	closedLoop(c, s.plain, keys, 64, time.Second)
	sluicePID, _ := strconv.Atoi(os.Getenv("SLUICE_EDGE_FIGURES_SLUICE_PID"))
	var cpuPlain, cpuEdge, cpuSluice []float64 // µs per request
	var satPlain, satEdge, ratio []float64
	var p50Plain, p50Edge, p99Plain, p99Edge, p50Add, p99Add []time.Duration
	for round := range rounds {
		c0 := selfCPU()
		sp := closedLoop(c, s.plain, keys, 64, d)
		c1, sl1 := selfCPU(), procCPU(sluicePID)
		se := closedLoop(c, s.edge, keys, 64, d)
		c2, sl2 := selfCPU(), procCPU(sluicePID)
		perReq := func(cpu time.Duration, r loadResult) float64 {
			return float64(cpu/time.Microsecond) / (r.rate * d.Seconds())
		}
		cpuPlain, cpuEdge = append(cpuPlain, perReq(c1-c0, sp)), append(cpuEdge, perReq(c2-c1, se))
		cpuSluice = append(cpuSluice, perReq(sl2-sl1, se))
		t.Logf("round %d: CPU per request (load, origin and proxy in this process): plain %.0f µs, edge %.0f µs; in Sluice %.0f µs",
			round+1, cpuPlain[round], cpuEdge[round], cpuSluice[round])
		rate := se.rate / 2
		op, oe := pairedOpenLoop(c, s.plain, s.edge, keys, rate, d)
		t.Logf("round %d: saturation plain %.0f/s, edge %.0f/s (%.2f; statuses %v); at %.0f/s in all, alternating: plain p50 %v p99 %v, edge p50 %v p99 %v (statuses %v, %v)",
			round+1, sp.rate, se.rate, se.rate/sp.rate, se.statuses, rate, op.p50, op.p99, oe.p50, oe.p99, op.statuses, oe.statuses)
		satPlain, satEdge, ratio = append(satPlain, sp.rate), append(satEdge, se.rate), append(ratio, se.rate/sp.rate)
		p50Plain, p50Edge = append(p50Plain, op.p50), append(p50Edge, oe.p50)
		p99Plain, p99Edge = append(p99Plain, op.p99), append(p99Edge, oe.p99)
		p50Add, p99Add = append(p50Add, oe.p50-op.p50), append(p99Add, oe.p99-op.p99)
	}
	// One request at a time, alternating between the proxies: the latency
	// the edge adds when nothing queues.
	var seq [2]*hdrhistogram.Histogram
	for i := range seq {
		seq[i] = hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	}
	for i := range 4000 {
		target := []string{s.plain, s.edge}[i%2]
		start := time.Now()
		request(c, target, keys[i%len(keys)])
		seq[i%2].RecordValue(int64(time.Since(start) / time.Microsecond))
	}
	t.Logf("SEQUENTIAL 2000 requests each, alternating: plain p50 %v p99 %v, edge p50 %v p99 %v, added p50 %v p99 %v",
		us(seq[0].ValueAtQuantile(50)), us(seq[0].ValueAtQuantile(99)), us(seq[1].ValueAtQuantile(50)), us(seq[1].ValueAtQuantile(99)),
		us(seq[1].ValueAtQuantile(50)-seq[0].ValueAtQuantile(50)), us(seq[1].ValueAtQuantile(99)-seq[0].ValueAtQuantile(99)))
	t.Logf("MEDIANS CPU per request: plain %.0f µs, edge %.0f µs (added %.0f µs), in Sluice %.0f µs",
		median(cpuPlain), median(cpuEdge), median(cpuEdge)-median(cpuPlain), median(cpuSluice))
	st := s.e.Client().Stats()
	t.Logf("MEDIANS of %d rounds of %v: saturation plain %.0f/s, edge %.0f/s, ratio %.2f; at 50%% of the edge's saturation: plain p50 %v p99 %v, edge p50 %v p99 %v, added p50 %v p99 %v; Sluice calls %d for %d checks (%.1f per call)",
		rounds, d, median(satPlain), median(satEdge), median(ratio), medianDur(p50Plain), medianDur(p99Plain), medianDur(p50Edge), medianDur(p99Edge),
		medianDur(p50Add), medianDur(p99Add), st.Calls, st.Batched, float64(st.Batched)/float64(max(st.Calls, 1)))
}

// TestFiguresDenialCache: one key over its limit, hammered (closed loop,
// 64 workers): the denials per second the edge answers, and the calls to
// Sluice they cost, with the local denial cache and without. Without it,
// checks that miss the 20 ms deadline fail open: they are let through.
func TestFiguresDenialCache(t *testing.T) {
	rounds, d := figuresEnabled(t)
	keys := []string{"attacker"}
	c := loadClient()
	type res struct {
		rate, calls, checks, failures float64
		p50, p99                      time.Duration
		statuses                      map[int]int64
	}
	run := func(cacheSize int) []res {
		s := newFigureSetup(t, oneRule("header:X-API-Key", 10, "1h", ""), func(c *Config) { c.Client.CacheSize = cacheSize })
		closedLoop(c, s.edge, keys, 64, time.Second) // spends the limit, warms up
		var out []res
		for range rounds {
			before := s.e.Client().Stats()
			r := closedLoop(c, s.edge, keys, 64, d)
			after := s.e.Client().Stats()
			per := func(a, b uint64) float64 { return float64(a-b) / d.Seconds() }
			out = append(out, res{float64(r.statuses[429]) / d.Seconds(), per(after.Calls, before.Calls), per(after.Batched, before.Batched),
				per(after.Failures, before.Failures), r.p50, r.p99, r.statuses})
		}
		return out
	}
	for _, cfg := range []struct {
		name string
		size int
	}{{"with the cache", 0}, {"without (--cache-size -1)", -1}} {
		rs := run(cfg.size)
		var rate, calls, checks, failures []float64
		var p50, p99 []time.Duration
		for _, r := range rs {
			rate, calls, checks, failures = append(rate, r.rate), append(calls, r.calls), append(checks, r.checks), append(failures, r.failures)
			p50, p99 = append(p50, r.p50), append(p99, r.p99)
		}
		t.Logf("MEDIANS %s: %.0f denials/s, %.0f Sluice calls/s carrying %.0f checks/s, %.0f failures/s (fail open: let through), p50 %v, p99 %v (rounds: %+v)",
			cfg.name, median(rate), median(calls), median(checks), median(failures), medianDur(p50), medianDur(p99), rs)
	}
}

// TestFiguresFailure: the time the edge takes to answer with Sluice down
// (connection refused) and with Sluice slow (it never answers: the 20 ms
// deadline expires), fail open and fail closed, measured by the HTTP
// client over 200 sequential requests and then under 16 concurrent
// workers.
func TestFiguresFailure(t *testing.T) {
	figuresEnabled(t)
	originSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer originSrv.Close()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	c := loadClient()
	for _, mode := range []string{"down", "slow"} {
		for _, policy := range []string{"open", "closed"} {
			n := nodetest.Start(t, "n1", nil)
			g := nodetest.NewGate(t, n.Addr)
			e := startEdge(t, originSrv.URL, g.Addr, func(cfg *Config) {
				cfg.Rules = oneRule("header:X-API-Key", 1_000_000, "1m", policy)
				cfg.Client.Timeout = 20 * time.Millisecond
			})
			target := "http://" + e.Addr() + "/"
			request(c, target, "warm") // a connection to Sluice, through the gate
			if mode == "down" {
				n.Stop()
				g.Close()
			} else {
				g.Stall()
			}
			h := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
			statuses := map[int]int{}
			for i := range 200 {
				start := time.Now()
				statuses[request(c, target, keys[i%len(keys)])]++
				h.RecordValue(int64(time.Since(start) / time.Microsecond))
			}
			conc := closedLoop(c, target, keys, 16, 2*time.Second)
			t.Logf("FAILURE Sluice %s, fail %s: sequential p50 %v p99 %v max %v (statuses %v); 16 workers: %.0f/s p50 %v p99 %v (statuses %v)",
				mode, policy, us(h.ValueAtQuantile(50)), us(h.ValueAtQuantile(99)), us(h.Max()), statuses, conc.rate, conc.p50, conc.p99, conc.statuses)
			e.Shutdown(context.Background())
			g.Close()
		}
	}
}
