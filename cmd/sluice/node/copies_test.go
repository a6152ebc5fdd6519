package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestClusterRollingRestartKeepsCopies: with a standby per key, a rolling
// restart under load (each node stopped gracefully and started again in
// turn) leaves every key's standby copy equal to the state of the node
// that decides it, and both equal to the hits the clients were told were
// allowed: were the deciding node to crash then, its standby would take
// the key over without losing one (S2 holds at every moment, not only
// after the fact).
func TestClusterRollingRestartKeepsCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a cluster")
	}
	tc := newTestClusterWith(t, 3, func(c *Config) { c.Router.Replicas = 2 })
	const keys, limit = 24, 1_000_000
	var allowed [keys]atomic.Int64
	// The workers reach the nodes through conns, nil while a node is down:
	// the restarts below replace the test servers' fields.
	conns := make([]atomic.Pointer[grpc.ClientConn], len(tc.nodes))
	for i, ts := range tc.nodes {
		conns[i].Store(ts.conn)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 200_000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := rand.IntN(len(conns))
				conn := conns[i].Load()
				if conn == nil {
					time.Sleep(time.Millisecond)
					continue
				}
				k := rand.IntN(keys)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, err := sluicepb.NewRateLimitServiceClient(conn).Check(ctx, &sluicepb.CheckRequest{
					Checks: []*sluicepb.Check{nativeCheck(fmt.Sprintf("copy-%02d", k), limit, time.Hour, 1)}})
				cancel()
				if err == nil && resp.Decisions[0].Allowed {
					allowed[k].Add(1)
				} else if err != nil && status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Canceled {
					t.Errorf("check copy-%02d via node %d: %v", k, i, err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	for i, ts := range tc.nodes {
		conns[i].Store(nil)
		ts.stop()
		ts.start()
		conns[i].Store(ts.conn)
		tc.waitMembers(3)
		tc.waitReady()
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	tc.waitReady()

	r := tc.nodes[0].srv.Router()
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("copy-%02d", k)
		deadline := time.Now().Add(10 * time.Second)
		for {
			owner, _ := r.Owner(key)
			standby := r.Standby(key)
			state, err1 := tc.local(owner, key)
			copy, err2 := tc.local(standby, key)
			msg := ""
			switch {
			case err1 != nil || err2 != nil:
				msg = fmt.Sprintf("read: %v, %v", err1, err2)
			case state.State.Used < allowed[k].Load():
				msg = fmt.Sprintf("%s's state counts %d; %d were acknowledged", owner, state.State.Used, allowed[k].Load())
			case copy.Replica.Used != state.State.Used:
				msg = fmt.Sprintf("%s's state counts %d, %s's standby copy %d (%d acknowledged)", owner, state.State.Used, standby, copy.Replica.Used, allowed[k].Load())
			}
			if msg == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: %s", key, msg)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// local reads key as the node named name holds it, and its standby copy.
func (tc *testCluster) local(name, key string) (*sluicepb.GetKeyResponse, error) {
	for _, ts := range tc.nodes {
		if ts.srv != nil && ts.cfg.NodeName == name {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return ts.admin().GetKey(ctx, &sluicepb.GetKeyRequest{Key: []byte(key), Local: true})
		}
	}
	return nil, fmt.Errorf("no running node %q", name)
}
