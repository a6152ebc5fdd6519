//go:build unix

package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitMembers polls node addr until it sees n members alive.
func waitMembers(t *testing.T, addr string, n int) {
	t.Helper()
	admin := sluicepb.NewAdminServiceClient(dial(t, addr))
	if err := testkit.Wait(30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := admin.ListMembers(ctx, &sluicepb.ListMembersRequest{})
		cancel()
		alive := 0
		if err == nil {
			for _, m := range resp.Members {
				if m.State == "alive" {
					alive++
				}
			}
		}
		if alive != n {
			return fmt.Errorf("%s: %d members alive (err %v); want %d", addr, alive, err, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitServing polls node addr until its grpc health says SERVING: it holds
// a lease and no key it gained waits for another node's handoff.
func waitServing(t *testing.T, addr string) {
	t.Helper()
	health := healthpb.NewHealthClient(dial(t, addr))
	if err := testkit.Wait(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		return fmt.Errorf("%s not serving: %v, %v", addr, resp, err)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryClusterKill9: three processes (with the default standby per
// key), one killed with SIGKILL under load and restarted on its data dir.
// While it is down, its keys fail fast until their standbys take over:
// every check on them that fails is UNAVAILABLE with a reason, answered in
// under half the callers' 2s deadline, and none waits for the deadline.
// Each of its keys is decided again by a survivor, from the standby's copy,
// and no key is ever over its limit. Once it is back, no key that reached
// its limit allows anything more in the window. (cluster/faults puts the
// same event, and others, through a ledger in network namespaces.)
//
// The keys the killed node was the standby of do not fail fast: once a
// copy to it failed, their owner holds them until failure detection gives
// them a new standby, and a check on them waits for that up to the
// router's HandoffWait (2s) or its own deadline, whichever comes first.
// The test logs those waits; it does not bound them.
func TestBinaryClusterKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-process cluster")
	}
	seed := gossipAddr(t)
	type member struct {
		name, gossip, data string
		p                  *proc
	}
	nodes := make([]*member, 3)
	for i := range nodes {
		n := &member{name: fmt.Sprintf("node-%d", i), data: t.TempDir()}
		n.gossip = seed
		if i > 0 {
			n.gossip = gossipAddr(t)
		}
		nodes[i] = n
	}
	start := func(n *member) {
		n.p = startProc(t, n.data, "--node-name", n.name, "--gossip-addr", n.gossip, "--join", seed, "--expect", "3", "--shutdown-timeout", "5s")
	}
	for _, n := range nodes {
		start(n)
	}
	waitMembers(t, nodes[0].p.grpcAddr, 3)
	for _, n := range nodes {
		waitServing(t, n.p.grpcAddr)
	}

	const keys, limit = 40, 5
	const deadline = 2 * time.Second
	// One check on key k, and what came of it.
	type call struct {
		k       int
		sent    time.Time
		took    time.Duration
		node    string // the deciding node, if decided
		allowed bool
		err     error
	}
	check := func(c sluicepb.RateLimitServiceClient, k int) call {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		r := call{k: k, sent: time.Now()}
		resp, err := c.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{
			Key: []byte(fmt.Sprintf("k%d", k)), Limit: limit, Window: durationpb.New(time.Hour), Cost: proto.Int64(1),
		}}})
		r.took = time.Since(r.sent)
		if r.err = err; err == nil {
			r.node, r.allowed = resp.Decisions[0].Node, resp.Decisions[0].Allowed
		}
		return r
	}
	clients := []sluicepb.RateLimitServiceClient{
		sluicepb.NewRateLimitServiceClient(dial(t, nodes[0].p.grpcAddr)),
		sluicepb.NewRateLimitServiceClient(dial(t, nodes[1].p.grpcAddr)),
	}
	// Half the limit before the kill, so the victim's disk (and the
	// standbys) hold hits.
	allowed := make([]int, keys)
	owner := make([]string, keys)
	for k := 0; k < keys; k++ {
		for i := 0; i < limit/2; i++ {
			if r := check(clients[0], k); r.err != nil || !r.allowed {
				t.Fatalf("warm-up hit on k%d = %+v", k, r)
			} else {
				owner[k] = r.node
			}
			allowed[k]++
		}
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := check(clients[i%2], (g*17+i)%keys)
				mu.Lock()
				calls = append(calls, r)
				mu.Unlock()
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()
	// poll waits until cond holds (under mu), for at most 30s.
	poll := func(what string, cond func() bool) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return cond()
		}, "%s", what)
	}
	poll("every key checked under load", func() bool { return len(calls) >= keys })
	victim := nodes[2]
	victim.p.signal(syscall.SIGKILL)
	<-victim.p.exited
	killed := time.Now()
	waitMembers(t, nodes[0].p.grpcAddr, 2)
	waitMembers(t, nodes[1].p.grpcAddr, 2)
	// Until each of the victim's keys is decided again by a survivor.
	poll("the victim's keys taken over", func() bool {
		back := map[int]bool{}
		for _, r := range calls {
			if r.err == nil && r.sent.After(killed) {
				back[r.k] = true
			}
		}
		for k := range keys {
			if owner[k] == victim.name && !back[k] {
				return false
			}
		}
		return true
	})
	stopLoad()

	refusals := map[string]int{} // of the victim's keys, by reason
	var slowest, otherSlowest time.Duration
	otherFailed := 0 // checks on the others' keys that failed
	for _, r := range calls {
		if r.err == nil {
			if r.allowed {
				allowed[r.k]++
			}
			if r.node == victim.name && r.sent.After(killed) {
				t.Errorf("k%d decided by the killed node %v after the kill", r.k, r.sent.Sub(killed))
			}
			continue
		}
		reason := ""
		for _, d := range status.Convert(r.err).Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.Reason
			}
		}
		if owner[r.k] != victim.name {
			otherFailed++
			otherSlowest = max(otherSlowest, r.took)
			continue
		}
		refusals[reason]++
		slowest = max(slowest, r.took)
		if status.Code(r.err) != codes.Unavailable || reason == "" || r.took > deadline/2 {
			t.Errorf("k%d (owned by %s), %v after the kill: failed in %v with %v; want UNAVAILABLE with a reason, in under %v",
				r.k, owner[r.k], r.sent.Sub(killed).Round(time.Millisecond), r.took.Round(time.Millisecond), r.err, deadline/2)
		}
	}
	t.Logf("%d calls; on node-2's keys, failed by reason: %v, the slowest in %v; on the others' keys, %d failed, the slowest in %v",
		len(calls), refusals, slowest.Round(time.Millisecond), otherFailed, otherSlowest.Round(time.Millisecond))
	if len(refusals) == 0 {
		t.Errorf("no check on node-2's keys failed while it was down: the kill went unseen")
	}
	for k := range allowed {
		if allowed[k] > limit {
			t.Errorf("k%d: %d allowed while node-2 was down; limit %d", k, allowed[k], limit)
		}
	}

	start(victim)
	waitMembers(t, nodes[0].p.grpcAddr, 3)
	waitMembers(t, victim.p.grpcAddr, 3)
	waitServing(t, victim.p.grpcAddr)
	for k := 0; k < keys; k++ {
		if allowed[k] < limit {
			continue // never reached its limit: more may fit
		}
		if r := check(clients[0], k); r.err != nil || r.allowed {
			t.Errorf("after node-2 returned, k%d (%d allowed before) = %+v; want denied", k, allowed[k], r)
		}
	}
}
