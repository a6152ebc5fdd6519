package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	sluice "github.com/sluice-io/sluice/client"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestKeyGetShowsHolders: key get lists a key's open reservations by
// holder, quota leases counted apart, and the checks denied while a lease
// was open.
func TestKeyGetShowsHolders(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil, "--node-name", "node-a")
	cfg := sluice.DefaultConfig()
	cfg.Addr, cfg.Timeout = n.grpcAddr, 5*time.Second
	c, err := sluice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	key := sluice.Check{Key: "tenant:hot", Limit: 10, Window: time.Hour}
	l, err := c.Lease(key, sluice.LeaseConfig{Slice: 6, TTL: time.Minute, Holder: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if d, err := l.Allow(ctx); err != nil || d.Source != sluice.SourceLease {
		t.Fatalf("Allow = %+v, %v; want a hit from a slice", d, err)
	}
	if _, err := c.Reserve(ctx, time.Minute, []sluice.Check{{Key: key.Key, Limit: 10, Window: time.Hour, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Check(ctx, sluice.Check{Key: key.Key, Limit: 10, Window: time.Hour, Cost: 5}); err != nil || d.Allowed {
		t.Fatalf("5 more with 3 left = %+v, %v; want denied", d, err)
	}

	r := mustRun(t, exitOK, nil, "key", "get", "tenant:hot", "--addr", n.grpcAddr)
	if f := tableFields(r.stdout); f["reservations"] != "2, 7 hits" || f["lease denials"] != "1" {
		t.Errorf("key get printed\n%s\nwant reservations \"2, 7 hits\" and lease denials 1", r.stdout)
	}
	if !regexp.MustCompile(`(?m)^HOLDER +RESERVATIONS +LEASES +HITS +LAST EXPIRES +DEMAND +SHARE +LEASED\nweb-1 +1 +1 +6 +\S+ +\d+ +all +6 *\n- +1 +0 +1 +\S+ +- +- +0`).MatchString(r.stdout) {
		t.Errorf("key get printed\n%s\nwant the holders web-1 (one lease of 6, with its demand and share) and - (a reservation of 1)", r.stdout)
	}
	r = mustRun(t, exitOK, nil, "key", "get", "tenant:hot", "--addr", n.grpcAddr, "-o", "json")
	var got sluicepb.GetKeyResponse
	decodeJSON(t, r.stdout, &got)
	if h := got.State.GetHolders(); len(h) != 2 || h[0].Holder != "web-1" || h[0].Leases != 1 || h[0].Hits != 6 || got.State.LeaseDenials != 1 {
		t.Errorf("key get -o json holders %v, lease denials %d; want web-1 with one lease of 6 first, 1 denial", h, got.State.LeaseDenials)
	}
	if !strings.Contains(r.stdout, `"lease_denials"`) {
		t.Errorf("key get -o json printed\n%s\nwant lease_denials", r.stdout)
	}
}
