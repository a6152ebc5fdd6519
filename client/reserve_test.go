package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node/nodetest"
)

// TestReserveSettle: a reservation holds its estimate against concurrent
// work; settling gives back what was not used, or records the overshoot,
// once; a reserve Sluice did not decide (the failure policy allowed it)
// is settled as a usage report, so the budget still counts what was
// spent.
func TestReserveSettle(t *testing.T) {
	n := nodetest.Start(t, "n1", nil)
	c := newClient(t, n.Addr, nil)
	ctx := context.Background()
	budget := client.Check{Key: "ai|team=t1", Limit: 1000, Window: time.Minute}
	est := budget
	est.Cost = 700

	r, err := c.Reserve(ctx, 30*time.Second, []client.Check{est})
	if err != nil || !r.Allowed || !r.Held() || r.Decisions[0].Remaining != 300 {
		t.Fatalf("Reserve(700 of 1000) = %+v, %v; want allowed and held, 300 remaining", r, err)
	}
	if r2, err := c.Reserve(ctx, 30*time.Second, []client.Check{est}); err != nil || r2.Allowed || r2.Held() {
		t.Fatalf("a second Reserve(700) = %+v, %v; want denied (the first holds 700)", r2, err)
	}
	got, err := c.Settle(ctx, r, 200)
	if err != nil || len(got) != 1 || !got[0].Settled || got[0].Returned != 500 || got[0].Remaining != 800 {
		t.Fatalf("Settle(200) = %+v, %v; want settled, 500 returned, 800 remaining", got, err)
	}
	if got, err := c.Settle(ctx, r, 0); err != nil || got[0].Settled {
		t.Fatalf("Settle again = %+v, %v; want not settled", got, err)
	}

	// Two budgets at once are reserved all or nothing.
	user := client.Check{Key: "ai|user=u1", Limit: 100, Window: time.Minute, Cost: 100}
	team := client.Check{Key: "ai|team=t1", Limit: 1000, Window: time.Minute, Cost: 150}
	r, err = c.Reserve(ctx, time.Minute, []client.Check{user, team})
	if err != nil || !r.Allowed || len(r.Handles()) != 2 {
		t.Fatalf("Reserve(user 100, team 150) = %+v, %v; want allowed with two handles", r, err)
	}
	got, err = c.Settle(ctx, r, 400)
	if err != nil || got[0].Overshoot != 300 || got[1].Overshoot != 250 || got[0].RetryAfter == 0 {
		t.Fatalf("Settle(400) over estimates of 100 and 150 = %+v, %v; want overshoots of 300 and 250, the user over its limit", got, err)
	}

	// Sluice down: the failure policy allows, and the settle reports.
	n2 := nodetest.Start(t, "n2", nil)
	gate := nodetest.NewGate(t, n2.Addr)
	c2 := newClient(t, gate.Addr, func(cfg *client.Config) { cfg.Timeout = 200 * time.Millisecond })
	gate.Close()
	r, err = c2.Reserve(ctx, time.Minute, []client.Check{est})
	if err == nil || !r.Allowed || r.Held() {
		t.Fatalf("Reserve with Sluice down = %+v, %v; want an error, allowed by the failure policy, not held", r, err)
	}
	c3 := newClient(t, n2.Addr, nil)
	got, err = c3.Settle(ctx, r, 1200)
	if err != nil || !got[0].Reported || got[0].Remaining != 0 {
		t.Fatalf("Settle of an unheld reservation = %+v, %v; want reported as usage, nothing remaining", got, err)
	}
}
