package api

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"github.com/sluice-io/sluice/scripts/testkit"
)

// connCtx is the context of a call on the connection from port.
func connCtx(port int) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:      &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8081},
	})
}

// TestRequestBudgetOverGRPC: while the node's request bytes in flight are
// at their bound, a call waits BudgetWait and is refused with
// RESOURCE_EXHAUSTED, its checks not decided (nothing recorded); once
// bytes are given back, calls are decided again. Before, nothing bounded
// what the calls being worked on held but their number.
func TestRequestBudgetOverGRPC(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) {
		c.MaxInflightBytes, c.MaxConnInflightBytes, c.BudgetWait = 1000, 1000, 50*time.Millisecond
	})
	// Another connection's call holds the whole node budget.
	hold, err := ts.srv.budget.acquire(connCtx(40000), 1000)
	if err != nil {
		t.Fatal(err)
	}
	c := sluicepb.NewRateLimitServiceClient(ts.conn)
	req := &sluicepb.CheckRequest{Checks: []*sluicepb.Check{apitest.Check("budget:1", 5, time.Hour, 1)}}
	start := time.Now()
	_, err = c.Check(ts.ctx(), req)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Check with the budget taken = %v; want RESOURCE_EXHAUSTED", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("refused after %v; want it to wait BudgetWait (50ms) first", waited)
	}
	hold.release()
	resp, err := c.Check(ts.ctx(), req)
	if err != nil || !resp.Decisions[0].Allowed || resp.Decisions[0].Remaining != 4 {
		t.Fatalf("Check with the budget free = %v, %v; want allowed, remaining 4 (the refused call recorded nothing)", resp, err)
	}
	// A call that waits is decided once the bytes come back, within its
	// wait.
	hold, err = ts.srv.budget.acquire(connCtx(40000), 1000)
	if err != nil {
		t.Fatal(err)
	}
	waited := count(t, ts.srv.budget.waited)
	go func() {
		// The bytes come back once the call waits for them.
		err := testkit.Wait(10*time.Second, func() error {
			var m dto.Metric
			if err := ts.srv.budget.waited.Write(&m); err != nil {
				return err
			}
			if m.GetCounter().GetValue() == waited {
				return errors.New("the call does not wait for the budget")
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		hold.release()
	}()
	ts.srv.budget.wait = 10 * time.Second
	if resp, err := c.Check(ts.ctx(), req); err != nil || resp.Decisions[0].Remaining != 3 {
		t.Errorf("Check that waited for the budget = %v, %v; want decided, remaining 3", resp, err)
	}
}

// TestRequestBudgetPerConnection: one connection cannot take more than its
// own budget, while another connection's call goes through; a canceled
// wait answers CANCELED and gives back nothing it did not take; a request
// larger than a budget takes all of it; the entries of connections with
// no call are bounded.
func TestRequestBudgetPerConnection(t *testing.T) {
	b := newRequestBudget(300, 100, 20*time.Millisecond, prometheus.NewRegistry())
	r1, err := b.acquire(connCtx(1), 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.acquire(connCtx(1), 60); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second call of 60 bytes on a connection with 40 left = %v; want RESOURCE_EXHAUSTED", err)
	}
	r2, err := b.acquire(connCtx(2), 5000) // larger than a connection budget: takes all of it, and as much of the node's
	if err != nil {
		t.Fatalf("call on another connection = %v; want it through", err)
	}
	ctx, cancel := context.WithCancel(connCtx(1))
	cancel()
	if _, err := b.acquire(ctx, 60); status.Code(err) != codes.Canceled {
		t.Errorf("canceled wait = %v; want CANCELED", err)
	}
	r3, err := b.acquire(connCtx(3), 100) // 60 + 100 + 100 of 300
	if err != nil {
		t.Fatalf("third connection = %v; want it through", err)
	}
	r1.release()
	r2.release()
	r3.release()
	// Entries outlive their connections' calls, up to a bound.
	for port := range 3 * idleConnEntries {
		h, err := b.acquire(connCtx(10+port), 1)
		if err != nil {
			t.Fatal(err)
		}
		h.release()
	}
	if len(b.conns) > idleConnEntries+1 {
		t.Errorf("%d connection entries left after every call ended; want at most %d", len(b.conns), idleConnEntries+1)
	}
	if !b.node.TryAcquire(300) {
		t.Errorf("the node budget is not whole again after every call ended")
	}
}

// BenchmarkRequestBudget: what the budget costs a call that fits, from
// many connections at once.
func BenchmarkRequestBudget(b *testing.B) {
	bud := newRequestBudget(2<<20, 512<<10, time.Second, prometheus.NewRegistry())
	b.ReportAllocs()
	var port atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		ctx := connCtx(40000 + int(port.Add(1)))
		for pb.Next() {
			hold, err := bud.acquire(ctx, 200)
			if err != nil {
				b.Fatal(err)
			}
			hold.release()
		}
	})
}
