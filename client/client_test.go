package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/cluster/clustertest"
	"github.com/sluice-io/sluice/cmd/sluice/node"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// TestMain starts the node the examples call, runs the tests, stops the
// node and checks that no goroutine outlives them.
func TestMain(m *testing.M) {
	stop, err := startExampleNode()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	if code == 0 {
		code = noLeaks()
	}
	os.Exit(code)
}

// noLeaks fails if a goroutine outlives the tests (polling for a while:
// gRPC's connections end shortly after Close returns).
func noLeaks() int {
	if err := testkit.Wait(10*time.Second, func() error { return goleak.Find() }); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// generous is the deadline of tests that are not about deadlines: the
// race detector on a shared 2-core machine makes some calls slow.
const generous = 5 * time.Second

// newClient returns a client of addr with a generous deadline; edit may
// change its config. It closes at the end of the test.
func newClient(t testing.TB, addr string, edit func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig()
	cfg.Addr = addr
	cfg.Timeout = generous
	if edit != nil {
		edit(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestCheckCounts: a key allows exactly its limit; the denial after it
// comes from Sluice with a retry_after, the next from the local cache
// without a call.
func TestCheckCounts(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	ctx := context.Background()
	ch := client.Check{Key: "user:42", Limit: 3, Window: time.Minute}
	for i := range 3 {
		d, err := c.Check(ctx, ch)
		if err != nil || !d.Allowed || d.Remaining != int64(2-i) || d.Limit != 3 || d.Node != "n1" {
			t.Fatalf("Check %d = %+v, %v; want allowed with %d remaining by n1", i+1, d, err, 2-i)
		}
	}
	d, err := c.Check(ctx, ch)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Minute || d.Source == client.SourceCache {
		t.Fatalf("Check 4 = %+v, %v; want denied by Sluice with 0 < RetryAfter <= 1m", d, err)
	}
	calls := c.Stats().Calls
	d, err = c.Check(ctx, ch)
	if err != nil || d.Allowed || d.Source != client.SourceCache || d.RetryAfter <= 0 || d.Node != "n1" {
		t.Fatalf("Check 5 = %+v, %v; want denied from the cache", d, err)
	}
	if got := c.Stats().Calls; got != calls {
		t.Errorf("the cached denial made %d calls; want 0", got-calls)
	}
	// Another key, or the same key with another limit, is not cached.
	for _, other := range []client.Check{
		{Key: "user:43", Limit: 3, Window: time.Minute},
		{Key: "user:42", Limit: 10, Window: time.Minute},
	} {
		if d, err := c.Check(ctx, other); err != nil || !d.Allowed || d.Source == client.SourceCache {
			t.Errorf("Check(%+v) = %+v, %v; want allowed by Sluice", other, d, err)
		}
	}
}

// TestCacheOnlyDeniesWhatSluiceDenies: under concurrent load on a short
// window, every denial the cache makes is one Sluice makes too: the same
// check sent at once to Sluice by a client without a cache is denied
// whenever its answer arrives before the cached retry_after ran out.
func TestCacheOnlyDeniesWhatSluiceDenies(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	cached := newClient(t, n.Addr, nil)
	direct := newClient(t, n.Addr, func(c *client.Config) { c.CacheSize = -1 })
	ctx := context.Background()
	var cacheDenials, verified atomic.Int64
	deadline := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch := client.Check{Key: fmt.Sprint("k", g%2), Limit: 3, Window: 200 * time.Millisecond}
			for time.Now().Before(deadline) {
				d, err := cached.Check(ctx, ch)
				if err != nil {
					t.Errorf("Check(%+v): %v", ch, err)
					return
				}
				if d.Source != client.SourceCache {
					continue
				}
				cacheDenials.Add(1)
				until := time.Now().Add(d.RetryAfter)
				dd, err := direct.Check(ctx, ch)
				answered := time.Now()
				if err != nil {
					t.Errorf("direct Check(%+v): %v", ch, err)
					return
				}
				if !answered.Before(until) {
					continue
				}
				verified.Add(1)
				if dd.Allowed {
					t.Errorf("the cache denied %+v for %v more, but Sluice allowed it %v later", ch, d.RetryAfter, d.RetryAfter-until.Sub(answered))
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d cache denials, %d checked against Sluice within their retry_after", cacheDenials.Load(), verified.Load())
	if verified.Load() == 0 {
		t.Errorf("no cache denial was checked against Sluice")
	}
}

// TestCoalescedExact: checks from many goroutines share calls, and one
// key hit by all of them still allows exactly its limit.
func TestCoalescedExact(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, func(c *client.Config) {
		c.MaxInFlight = 1
		c.BatchWait = time.Millisecond
		c.CacheSize = -1
	})
	ctx := context.Background()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				d, err := c.Check(ctx, client.Check{Key: "hot", Limit: 100, Window: time.Hour})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	s := c.Stats()
	if got := allowed.Load(); got != 100 {
		t.Errorf("320 checks on a limit of 100 allowed %d; want 100", got)
	}
	if s.Batched != 320 || s.Calls*4 > s.Batched {
		t.Errorf("Stats = %+v; want 320 checks in at most 80 calls", s)
	}
	t.Logf("320 checks in %d calls", s.Calls)
}

// TestCheckAllLogin: the login rule. A username that is over its limit
// denies the request without spending the client IP's hit, and the IP's
// own limit applies to every username.
func TestCheckAllLogin(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, func(c *client.Config) { c.CacheSize = -1 })
	ctx := context.Background()
	login := func(ip, user string) []client.Decision {
		t.Helper()
		ds, err := c.CheckAll(ctx, []client.Check{
			{Key: "login:ip:" + ip, Limit: 5, Window: time.Minute},
			{Key: "login:user:" + user, Limit: 2, Window: time.Minute},
		})
		if err != nil {
			t.Fatalf("CheckAll(%s, %s): %v", ip, user, err)
		}
		return ds
	}
	for i := range 2 {
		if ds := login("10.0.0.1", "alice"); !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("login %d as alice = %+v; want both allowed", i+1, ds)
		}
	}
	ds := login("10.0.0.1", "alice")
	if ds[0].Allowed || ds[1].Allowed || ds[0].RetryAfter != 0 || ds[1].RetryAfter <= 0 {
		t.Fatalf("third login as alice = %+v; want both denied, the user check blocking", ds)
	}
	if ds[0].Remaining != 3 {
		t.Errorf("the IP has %d remaining after a denied login; want 3 (the denial spent nothing)", ds[0].Remaining)
	}
	// More usernames from the same IP: the IP's limit of 5 stops the
	// fourth.
	for i, user := range []string{"bob", "carol", "dave", "erin"} {
		ds := login("10.0.0.1", user)
		want := i < 3
		if ds[0].Allowed != want || ds[1].Allowed != want {
			t.Errorf("login as %s = %+v; want allowed %v", user, ds, want)
		}
	}
}

// TestFailurePolicies: with Sluice killed, slow, or answering
// UNAVAILABLE, each check gets its policy's answer (FailOpen allows,
// FailClosed denies), a decision that says which failure, within the
// deadline.
func TestFailurePolicies(t *testing.T) {
	const timeout = 100 * time.Millisecond
	type setup func(t *testing.T) string
	tests := []struct {
		name    string
		addr    setup
		failure client.Failure
		minTime time.Duration // the decision takes at least this long
	}{
		{"killed", func(t *testing.T) string {
			n := nodetest.Start(t, "n1", nil)
			g := nodetest.NewGate(t, n.Addr)
			warm(t, g.Addr)
			n.Stop()
			g.Close()
			return g.Addr
		}, client.FailureUnreachable, 0},
		{"slow", func(t *testing.T) string {
			n := nodetest.Start(t, "n1", nil)
			g := nodetest.NewGate(t, n.Addr)
			warm(t, g.Addr)
			g.Stall()
			return g.Addr
		}, client.FailureTimeout, timeout},
		{"real node without quorum", func(t *testing.T) string {
			gossip := "127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t))
			return nodetest.Start(t, "n1", func(c *node.Config) {
				cc := cluster.DefaultConfig()
				cc.GossipAddr = gossip
				cc.Expect = 3
				c.Cluster = &cc
			}).Addr
		}, client.FailureUnavailable, 0},
		{"overloaded", func(t *testing.T) string {
			return nodetest.NewRefuser(t, status.Error(codes.ResourceExhausted, "actor: overloaded"), -1, "").Addr
		}, client.FailureOverloaded, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := tt.addr(t)
			c := newClient(t, addr, func(c *client.Config) { c.Timeout = timeout })
			for _, policy := range []client.Policy{client.FailOpen, client.FailClosed} {
				ch := client.Check{Key: "k", Limit: 5, Window: time.Minute, OnFailure: policy}
				start := time.Now()
				d, err := c.Check(context.Background(), ch)
				took := time.Since(start)
				want := client.Decision{Allowed: policy == client.FailOpen, Remaining: -1, Source: client.SourceFailure, Failure: tt.failure, Policy: policy}
				if err == nil || d != want {
					t.Errorf("%v: Check = %+v, %v; want %+v and an error", policy, d, err, want)
				}
				if took < tt.minTime || took > timeout+200*time.Millisecond {
					t.Errorf("%v: decided in %v; want %v to %v", policy, took, tt.minTime, timeout+200*time.Millisecond)
				}
				t.Logf("%s, %v: %v in %v (%v)", tt.name, policy, d.Allowed, took, err)
			}
		})
	}
}

// warm makes one call through a fresh client so that the gate holds a
// connection.
func warm(t *testing.T, addr string) {
	t.Helper()
	c := newClient(t, addr, nil)
	if d, err := c.Check(context.Background(), client.Check{Key: "warm", Limit: 1, Window: time.Second, Peek: true}); err != nil || !d.Known() {
		t.Fatalf("warm-up check = %+v, %v", d, err)
	}
}

// TestPolicyPrecedence: a check's policy beats the call's, which beats
// the client's.
func TestPolicyPrecedence(t *testing.T) {
	c := newClient(t, "127.0.0.1:1", func(c *client.Config) { c.OnFailure = client.FailClosed; c.Timeout = time.Second })
	ctx := context.Background()
	for _, tt := range []struct {
		check, call, want client.Policy
	}{
		{client.PolicyDefault, client.PolicyDefault, client.FailClosed},
		{client.PolicyDefault, client.FailOpen, client.FailOpen},
		{client.FailClosed, client.FailOpen, client.FailClosed},
		{client.FailOpen, client.PolicyDefault, client.FailOpen},
	} {
		d, _ := c.Check(ctx, client.Check{Key: "k", Limit: 1, Window: time.Second, OnFailure: tt.check}, client.WithPolicy(tt.call))
		if d.Policy != tt.want || d.Allowed != (tt.want == client.FailOpen) || d.Failure != client.FailureUnreachable {
			t.Errorf("check %v, call %v: decision %+v; want policy %v", tt.check, tt.call, d, tt.want)
		}
	}
}

// TestRetryOnOwnershipMoving: a node that answers "ownership moving" gets
// one more try within the deadline; a second refusal is the failure.
func TestRetryOnOwnershipMoving(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	// A node says why in an ErrorInfo; older ones in the message alone.
	st, err := status.New(codes.Unavailable, "the key is moving").WithDetails(&errdetails.ErrorInfo{Domain: "sluice.io", Reason: "OWNERSHIP_MOVING"})
	if err != nil {
		t.Fatal(err)
	}
	for _, moving := range []error{st.Err(), status.Error(codes.Unavailable, "cluster: ownership moving: the state of 1 key has not arrived")} {
		testRetryOnOwnershipMoving(t, n, moving)
	}
	// Other refusals are not retried.
	r := nodetest.NewRefuser(t, status.Error(codes.Unavailable, "cluster: no quorum"), 1, n.Addr)
	c := newClient(t, r.Addr, nil)
	if d, _ := c.Check(context.Background(), client.Check{Key: "k", Limit: 5, Window: time.Minute}); d.Failure != client.FailureUnavailable || c.Stats().Retries != 0 {
		t.Errorf("no quorum: %+v, %+v; want a failure without a retry", d, c.Stats())
	}
}

func testRetryOnOwnershipMoving(t *testing.T, n *nodetest.Node, moving error) {
	t.Helper()
	for _, tt := range []struct {
		fails   int64
		allowed bool
		failure client.Failure
	}{
		{1, true, client.FailureNone},
		{2, false, client.FailureUnavailable},
	} {
		r := nodetest.NewRefuser(t, moving, tt.fails, n.Addr)
		c := newClient(t, r.Addr, func(c *client.Config) { c.OnFailure = client.FailClosed })
		d, err := c.Check(context.Background(), client.Check{Key: "k", Limit: 5, Window: time.Minute})
		if d.Allowed != tt.allowed || d.Failure != tt.failure || (err == nil) != tt.allowed {
			t.Errorf("%v, %d refusals: Check = %+v, %v; want allowed %v, failure %v", moving, tt.fails, d, err, tt.allowed, tt.failure)
		}
		if s := c.Stats(); s.Retries != 1 || s.Calls != 2 || r.Calls.Load() != 2 {
			t.Errorf("%d refusals: %+v, %d calls received; want 1 retry, 2 calls", tt.fails, s, r.Calls.Load())
		}
	}
}

// TestSourceOwner: once the client learned the name of the node it
// calls, decisions of that node say SourceOwner.
func TestSourceOwner(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	i := 0
	testkit.Eventually(t, generous, func() bool {
		i++
		d, err := c.Check(context.Background(), client.Check{Key: fmt.Sprint("k", i), Limit: 5, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != client.SourceOwner && d.Source != client.SourceSluice {
			t.Fatalf("Check = %+v; want SourceSluice, then SourceOwner", d)
		}
		return d.Source == client.SourceOwner
	}, "decisions to say SourceOwner (they say SourceSluice)")
	if got := c.Node(); got != "n1" {
		t.Errorf("Node() = %q; want n1", got)
	}
}

// TestSourceForwarded: in a 2-node cluster, the node the client calls
// decides its own keys (SourceOwner) and forwards the others
// (SourceForwarded, Node naming the owner).
func TestSourceForwarded(t *testing.T) {
	gossip := []string{"127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t)), "127.0.0.1:" + strconv.Itoa(clustertest.FreePort(t))}
	var nodes []*nodetest.Node
	for i, name := range []string{"n0", "n1"} {
		nodes = append(nodes, nodetest.Start(t, name, func(c *node.Config) {
			cc := cluster.DefaultConfig()
			cc.GossipAddr = gossip[i]
			cc.Join = []string{gossip[0]}
			cc.Expect = 2
			c.Cluster = &cc
			c.Router.Replicas = 1
		}))
	}
	c := newClient(t, nodes[0].Addr, func(c *client.Config) { c.CacheSize = -1 })
	seen := map[client.Source]string{}
	i := 0
	err := testkit.Wait(20*time.Second, func() error {
		i++
		d, err := c.Check(context.Background(), client.Check{Key: fmt.Sprint("k", i), Limit: 5, Window: time.Minute})
		if err != nil {
			return err // the cluster is forming
		}
		switch d.Source {
		case client.SourceOwner, client.SourceForwarded:
			seen[d.Source] = d.Node
		case client.SourceSluice:
		default:
			t.Fatalf("Check = %+v; want a decision of Sluice", d)
		}
		if len(seen) < 2 {
			return fmt.Errorf("decisions came from %v; want SourceOwner and SourceForwarded", seen)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen[client.SourceOwner] != "n0" || seen[client.SourceForwarded] != "n1" {
		t.Errorf("owners by source: %v; want n0 for owner, n1 for forwarded", seen)
	}
}

// TestClosed: checks after Close fail with ErrClosed and their policy.
func TestClosed(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	c.Close()
	d, err := c.Check(context.Background(), client.Check{Key: "k", Limit: 1, Window: time.Second, OnFailure: client.FailClosed})
	if !errors.Is(err, client.ErrClosed) || d.Allowed || d.Failure != client.FailureClosed {
		t.Errorf("Check after Close = %+v, %v; want denied, ErrClosed", d, err)
	}
	ds, err := c.CheckAll(context.Background(), []client.Check{{Key: "k", Limit: 1, Window: time.Second}})
	if !errors.Is(err, client.ErrClosed) || !ds[0].Allowed || ds[0].Failure != client.FailureClosed {
		t.Errorf("CheckAll after Close = %+v, %v; want allowed (fail open), ErrClosed", ds, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestInvalidCheck: a check Sluice refuses is FailureRejected, with the
// server's reason in the error.
func TestInvalidCheck(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	d, err := c.Check(context.Background(), client.Check{Key: "k", Limit: 1, Window: time.Second, Cost: 5})
	if status.Code(err) != codes.InvalidArgument || d.Failure != client.FailureRejected || !d.Allowed {
		t.Errorf("Check(cost 5 > limit 1) = %+v, %v; want FailureRejected, fail open, INVALID_ARGUMENT", d, err)
	}
}

// TestRefund: a refund, sent with the node's refund token, gives a hit
// back and clears the key's cached denial, so the next check is allowed
// at once; without the token it is refused.
func TestRefund(t *testing.T) {
	n := nodetest.Start(t, "n1", func(c *node.Config) { c.RefundToken = "r3fund" })
	ctx := context.Background()
	ch := client.Check{Key: "job:7", Limit: 1, Window: time.Hour}
	c := newClient(t, n.Addr, func(c *client.Config) { c.Token = "r3fund" })
	for i, want := range []bool{true, false, false} {
		if d, err := c.Check(ctx, ch); err != nil || d.Allowed != want {
			t.Fatalf("Check %d = %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
	refund := ch
	refund.Refund = true
	if d, err := c.Check(ctx, refund); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("refund = %+v, %v; want allowed, 1 remaining", d, err)
	}
	if d, err := c.Check(ctx, ch); err != nil || !d.Allowed || d.Source == client.SourceCache {
		t.Errorf("Check after the refund = %+v, %v; want allowed by Sluice", d, err)
	}

	anon := newClient(t, n.Addr, nil)
	d, err := anon.Check(ctx, refund)
	if status.Code(err) != codes.Unauthenticated && status.Code(err) != codes.PermissionDenied || d.Failure != client.FailureRejected {
		t.Errorf("refund without the token = %+v, %v; want refused", d, err)
	}
}
