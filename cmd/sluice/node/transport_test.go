package node

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// dialH2 opens a raw HTTP/2 connection to addr, closed at the end of the
// test.
func dialH2(t *testing.T, addr string, settings ...http2.Setting) *apitest.H2Conn {
	t.Helper()
	c, err := apitest.DialH2(addr, settings...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkBody is the body of a native Check call: a peek on key.
func checkBody(t *testing.T, key string) []byte {
	t.Helper()
	b, err := apitest.GRPCMessage(&sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck(key, 100, time.Minute, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStreamBound: a node tells every client how many calls it may have in
// flight on one connection (SETTINGS_MAX_CONCURRENT_STREAMS), counts a
// call until its answer is sent, and refuses (RST_STREAM REFUSED_STREAM)
// the calls of a client that opens more, so that a client that never reads
// its answers holds at most that many. A gRPC client with more calls than
// the bound queues them: every one is answered.
func TestStreamBound(t *testing.T) {
	t.Parallel()
	const bound = 4
	ts := newTestServer(t, func(c *Config) { c.MaxConcurrentStreams = bound })
	// A window of 0 bytes: the node can send no answer's DATA.
	c := dialH2(t, ts.srv.GRPCAddr(), http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	settings, err := c.ServerSettings(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := settings[http2.SettingMaxConcurrentStreams]; got != bound {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d (settings %v); want %d", got, settings, bound)
	}
	body := checkBody(t, "streams")
	var ids []uint32
	for range bound + 2 {
		id, err := c.Call("/sluice.v1.RateLimitService/Check", body)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	refused := map[uint32]bool{}
	c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(refused) < 2 {
		f, err := c.Framer.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answers to %d calls on a connection that allows %d: %v; refused so far %v", len(ids), bound, err, refused)
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.ErrCode != http2.ErrCodeRefusedStream || !slices.Contains(ids[bound:], rst.StreamID) {
				t.Fatalf("RST_STREAM %v on stream %d; want REFUSED_STREAM on the calls past the bound, %v", rst.ErrCode, rst.StreamID, ids[bound:])
			}
			refused[rst.StreamID] = true
		}
	}

	var wg sync.WaitGroup
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	for i := range 5 * bound {
		wg.Go(func() {
			if _, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("queued", 100, time.Minute, 1)}}); err != nil {
				t.Errorf("call %d of %d in flight on a connection that allows %d: %v; want it queued and answered", i, 5*bound, bound, err)
			}
		})
	}
	wg.Wait()
}

// TestConnectionBound: a listener holds at most MaxConnections
// connections; the next one is not served (no HTTP/2 SETTINGS) until one
// closes, and then it is. Each listener has a budget of its own: the admin
// listener serves while the decision one is full.
func TestConnectionBound(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, func(c *Config) {
		c.MaxConnections = 2
		c.AdminAddr = "127.0.0.1:0"
	})
	addr := ts.srv.GRPCAddr()
	served := func(c *apitest.H2Conn, within time.Duration) error {
		_, err := c.ServerSettings(within)
		return err
	}
	first, second := dialH2(t, addr), dialH2(t, addr)
	for i, c := range []*apitest.H2Conn{first, second} {
		if err := served(c, 10*time.Second); err != nil {
			t.Fatalf("connection %d of 2 allowed: %v; want it served", i+1, err)
		}
	}
	third := dialH2(t, addr)
	if err := served(third, 300*time.Millisecond); err == nil {
		t.Fatalf("a third connection was served while 2 are open and 2 allowed")
	}
	if err := served(dialH2(t, ts.srv.AdminAddr()), 10*time.Second); err != nil {
		t.Errorf("the admin listener, with none of its own 2 connections open: %v; want it served", err)
	}
	if got := counterValue(t, ts, "sluice_connection_limit_waits_total", "grpc"); got < 1 {
		t.Errorf("sluice_connection_limit_waits_total{listener=\"grpc\"} = %v; want at least 1", got)
	}
	first.Close()
	if err := served(third, 10*time.Second); err != nil {
		t.Fatalf("the third connection, once the first closed: %v; want it served", err)
	}
}

// TestLimitListener: a listener bounded to one connection accepts the
// next one only once the first closed (closing twice frees one slot), and
// Close ends an Accept that waits for a slot.
func TestLimitListener(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 1, "test", newMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	first := <-accepted
	dial()
	dial()
	select {
	case <-accepted:
		t.Fatal("accepted a second connection while the first is open and 1 is allowed")
	case <-time.After(100 * time.Millisecond):
	}
	first.Close()
	first.Close()
	second := <-accepted
	select {
	case <-accepted:
		t.Fatal("closing the first connection twice freed two slots")
	case <-time.After(100 * time.Millisecond):
	}
	second.Close()
	<-accepted // the third one, which now holds the slot
	dial()     // waits for a slot
	l.Close()
	select {
	case err := <-acceptErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close = %v; want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waits for a slot 10 s after Close")
	}
}

// TestKeepalive: a client that goes silent (here: never answers the
// node's pings) is dropped within KeepaliveTime + KeepaliveTimeout; a
// client that answers pings but makes no call is sent away (GOAWAY) after
// MaxConnectionIdle.
func TestKeepalive(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		edit func(*Config)
		ack  bool
		want []string // frames from the node but SETTINGS, in order, before it closed the connection
	}{
		{"silent", func(c *Config) { c.KeepaliveTime, c.KeepaliveTimeout = time.Second, 200*time.Millisecond }, false, []string{"PING"}},
		{"idle", func(c *Config) { c.MaxConnectionIdle = 300 * time.Millisecond }, true, []string{"GOAWAY(NO_ERROR)", "PING", "GOAWAY(NO_ERROR)"}},
	} {
		ts := newTestServer(t, tt.edit)
		c := dialH2(t, ts.srv.GRPCAddr())
		start := time.Now()
		seen, err := c.Closed(10*time.Second, tt.ack)
		seen = slices.DeleteFunc(seen, func(f string) bool { return f == "SETTINGS" })
		if err != nil || !slices.Equal(seen, tt.want) {
			t.Errorf("%s client: %v after %v, frames %v; want the connection closed after %v", tt.name, err, time.Since(start).Round(time.Millisecond), seen, tt.want)
		}
	}
}

// TestMaxConnectionAge: a connection in use is sent away (GOAWAY) after
// MaxConnectionAge and closed MaxConnectionAgeGrace later, so a client
// that never goes idle, as Envoy does not, dials again (after a scale-up:
// a new node, perhaps); a gRPC client calling all along sees no error, and
// its calls go on over new connections. Unset, the age is 5 minutes.
func TestMaxConnectionAge(t *testing.T) {
	t.Parallel()
	if got := DefaultConfig().withTransportDefaults(); got.MaxConnectionAge != 5*time.Minute || got.MaxConnectionAgeGrace != 30*time.Second {
		t.Errorf("default MaxConnectionAge %v, grace %v; want 5m, 30s", got.MaxConnectionAge, got.MaxConnectionAgeGrace)
	}
	ts := newTestServer(t, func(c *Config) {
		c.MaxConnectionIdle = time.Hour // not what sends the connections away here
		// A grace long enough for the client's ping ack to come back on a
		// loaded machine: the node closes without the last GOAWAY if the
		// grace ends first.
		c.MaxConnectionAge, c.MaxConnectionAgeGrace = 300*time.Millisecond, 2*time.Second
	})

	// Raw HTTP/2: the node's GOAWAY, then a ping to learn the client saw
	// it, the last GOAWAY, and the close at the end of the grace.
	c := dialH2(t, ts.srv.GRPCAddr())
	seen, err := c.Closed(10*time.Second, true)
	seen = slices.DeleteFunc(seen, func(f string) bool { return f == "SETTINGS" })
	if want := []string{"GOAWAY(NO_ERROR)", "PING", "GOAWAY(NO_ERROR)"}; err != nil || !slices.Equal(seen, want) {
		t.Errorf("a connection older than MaxConnectionAge: %v, frames %v; want %v and closed", err, seen, want)
	}

	// A gRPC client: calls all along, never an error, at least two dials.
	var dials atomic.Int32
	conn, err := grpc.NewClient(ts.srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := sluicepb.NewRateLimitServiceClient(conn)
	ctx := ts.ctx()
	calls := 0
	for deadline := time.Now().Add(20 * time.Second); dials.Load() < 3; calls++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls over 20 s made %d dials; want 3 (connections sent away at 300 ms)", calls, dials.Load())
		}
		if _, err := client.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("age", 1<<30, time.Minute, 1)}}); err != nil {
			t.Fatalf("call %d, after %d dials: %v; want no error across the GOAWAYs", calls, dials.Load(), err)
		}
	}
}

// TestKeepaliveEnforcement: clients may ping every KeepaliveMinTime, even
// with no call in flight; a client that pings faster is sent away (GOAWAY
// ENHANCE_YOUR_CALM, after which the node closes the connection).
func TestKeepaliveEnforcement(t *testing.T) {
	t.Parallel()
	ts := newTestServer(t, func(c *Config) { c.KeepaliveMinTime = 50 * time.Millisecond })
	for _, tt := range []struct {
		every    time.Duration
		sentAway bool
	}{
		{250 * time.Millisecond, false},
		{time.Millisecond, true},
	} {
		c := dialH2(t, ts.srv.GRPCAddr())
		if _, err := c.ServerSettings(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		type result struct {
			seen []string
			err  error
		}
		done := make(chan result, 1)
		go func() {
			seen, err := c.Closed(6*tt.every+time.Second, false)
			done <- result{seen, err}
		}()
		for i := 0; i < 6; i++ {
			if err := c.Framer.WritePing(false, [8]byte{byte(i)}); err != nil {
				break // closed
			}
			time.Sleep(tt.every) // not a poll: the ping rate under test
		}
		r := <-done
		if calm := slices.Contains(r.seen, "GOAWAY(ENHANCE_YOUR_CALM)"); calm != tt.sentAway {
			t.Errorf("pinging every %v with no call in flight: the node sent %v; want GOAWAY(ENHANCE_YOUR_CALM): %v", tt.every, r.seen, tt.sentAway)
		}
	}
}
