//go:build unix

package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
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
	deadline := time.Now().Add(30 * time.Second)
	for {
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
		if alive == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d members alive (err %v); want %d", addr, alive, err, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitServing polls node addr until its grpc health says SERVING: it holds
// a lease and no key it gained waits for another node's handoff.
func waitServing(t *testing.T, addr string) {
	t.Helper()
	health := healthpb.NewHealthClient(dial(t, addr))
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not serving within 20s: %v, %v", addr, resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBinaryClusterKill9: three processes, one killed with SIGKILL under
// load and restarted on its data dir. While it is down, its keys fail fast
// (under the exact policy nobody else decides them), and no key is ever
// over its limit. Once it is back, no key that reached its limit allows
// anything more in the window. (cluster/faults puts the same event, and
// others, through a ledger in network namespaces.)
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
	check := func(c sluicepb.RateLimitServiceClient, k int) (allowed bool, err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := c.Check(ctx, &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{
			Key: []byte(fmt.Sprintf("k%d", k)), Limit: limit, Window: durationpb.New(time.Hour), Cost: proto.Int64(1),
		}}})
		if err != nil {
			return false, err
		}
		return resp.Decisions[0].Allowed, nil
	}
	clients := []sluicepb.RateLimitServiceClient{
		sluicepb.NewRateLimitServiceClient(dial(t, nodes[0].p.grpcAddr)),
		sluicepb.NewRateLimitServiceClient(dial(t, nodes[1].p.grpcAddr)),
	}
	var mu sync.Mutex
	allowed := make([]int, keys)
	failed := 0
	load := func(stop <-chan struct{}) {
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
					k := (g*17 + i) % keys
					ok, err := check(clients[i%2], k)
					mu.Lock()
					if err != nil {
						failed++
					} else if ok {
						allowed[k]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	// Half the limit before the kill, so the victim's disk holds hits.
	for k := 0; k < keys; k++ {
		for i := 0; i < limit/2; i++ {
			if ok, err := check(clients[0], k); err != nil || !ok {
				t.Fatalf("warm-up hit on k%d = %v, %v", k, ok, err)
			}
			allowed[k]++
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { load(stop); close(done) }()
	time.Sleep(100 * time.Millisecond) // under load (not a correctness wait)
	victim := nodes[2]
	victim.p.signal(syscall.SIGKILL)
	<-victim.p.exited
	waitMembers(t, nodes[0].p.grpcAddr, 2)
	time.Sleep(300 * time.Millisecond) // the survivors decide the victim's keys for a while
	close(stop)
	<-done

	t.Logf("while node-2 was down: %d calls failed fast (its keys wait for it under the exact policy)", failed)
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
		if ok, err := check(clients[0], k); err != nil || ok {
			t.Errorf("after node-2 returned, k%d (%d allowed before) = %v, %v; want denied", k, allowed[k], ok, err)
		}
	}
}
