package httplimit_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/client/httplimit"
)

// TestLeaseRule: a service-wide rule held as quota leases beside a plain
// per-user rule, against a real node. Requests the per-user rule denies
// give their leased hit back, so the service-wide key allows exactly its
// limit; once it is spent, requests it denies spend nothing of the
// per-user rule; most allowed requests were decided without a call.
func TestLeaseRule(t *testing.T) {
	c := newClient(t, sluiceAddr, nil)
	prefix := fmt.Sprintf("leasetest-%d|", time.Now().UnixNano())
	l, err := httplimit.New(httplimit.Config{
		Client:    c,
		KeyPrefix: prefix,
		Rules: []httplimit.Rule{
			{Name: "api", Key: httplimit.Const("all"), Limit: 50, Window: time.Hour,
				Lease: &client.LeaseConfig{Slice: 10, TTL: time.Minute}},
			{Name: "per_user", Key: httplimit.Header("X-User"), Limit: 3, Window: time.Hour},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(user string) httplimit.Result {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", user)
		return l.Decide(r)
	}
	allowed, fromLease := 0, 0
	var apiKey string
	for u := range 20 {
		for range 4 { // the fourth is over the user's limit
			res := decide(fmt.Sprintf("u%d", u))
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			apiKey = res.Rules[0].Key
			if res.Allowed {
				allowed++
				if res.Rules[0].Decision.Source == client.SourceLease {
					fromLease++
				}
			}
		}
	}
	if allowed != 50 {
		t.Errorf("%d requests allowed; want exactly the service-wide limit, 50 (the per-user denials must give their leased hit back)", allowed)
	}
	if fromLease < 40 {
		t.Errorf("%d of %d allowed requests decided from a slice; want most (slices of 10)", fromLease, allowed)
	}

	// The service-wide key is spent: its denials spend nothing per user.
	var perUserKey string
	for range 2 {
		res := decide("late")
		if res.Allowed {
			t.Fatal("a request allowed past the service-wide limit")
		}
		perUserKey = res.Rules[1].Key
	}
	peek := func(key string, limit int64) client.Decision {
		d, err := c.Check(context.Background(), client.Check{Key: key, Limit: limit, Window: time.Hour, Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := peek(perUserKey, 3); d.Remaining != 3 {
		t.Errorf("per-user key of a request the leased rule denied: remaining %d; want 3 (not asked)", d.Remaining)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := peek(apiKey, 50); d.Remaining != 0 {
		t.Errorf("after Close settled the slices, the service-wide key has %d left; want 0 (50 allowed, all counted)", d.Remaining)
	}
	if res := decide("after-close"); res.Allowed || res.Rules[0].Decision.Source == client.SourceLease {
		t.Errorf("after Close: %+v; want a denial decided by Sluice", res.Rules[0].Decision)
	}
}

// TestLeaseRuleValidation: what a lease cannot be combined with, and a
// Client that cannot lease, are refused by New.
func TestLeaseRuleValidation(t *testing.T) {
	c := newClient(t, sluiceAddr, nil)
	lease := &client.LeaseConfig{}
	for _, tc := range []struct {
		name string
		cfg  httplimit.Config
		want string
	}{
		{"shadow", httplimit.Config{Client: c, Rules: []httplimit.Rule{{Name: "a", Key: httplimit.Const("x"), Limit: 5, Window: time.Second, Shadow: true, Lease: lease}}}, "shadow rule takes no lease"},
		{"cost", httplimit.Config{Client: c, Rules: []httplimit.Rule{{Name: "a", Key: httplimit.Const("x"), Limit: 5, Window: time.Second, Cost: 2, Lease: lease}}}, "spends one hit"},
		{"sliding window", httplimit.Config{Client: c, Rules: []httplimit.Rule{{Name: "a", Key: httplimit.Const("x"), Limit: 5, Window: time.Second, Algorithm: client.SlidingWindow, Lease: lease}}}, "takes no leases"},
		{"not a leaser", httplimit.Config{Client: checkerOnly{c}, Rules: []httplimit.Rule{{Name: "a", Key: httplimit.Const("x"), Limit: 5, Window: time.Second, Lease: lease}}}, "a Client that leases"},
	} {
		if _, err := httplimit.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// checkerOnly is a Checker that does not lease.
type checkerOnly struct{ c *client.Client }

func (k checkerOnly) Check(ctx context.Context, ch client.Check, opts ...client.Option) (client.Decision, error) {
	return k.c.Check(ctx, ch, opts...)
}

func (k checkerOnly) CheckAll(ctx context.Context, checks []client.Check, opts ...client.Option) ([]client.Decision, error) {
	return k.c.CheckAll(ctx, checks, opts...)
}
