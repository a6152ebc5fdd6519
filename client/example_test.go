package client_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/sluice-io/sluice/client"
	"github.com/sluice-io/sluice/cmd/sluice/node"
)

// sluiceAddr is the address of the node the examples call: a node that
// TestMain starts on 127.0.0.1:0. In a real program it is the address of
// sluice serve's --grpc-addr (127.0.0.1:8081 by default) or of the
// Service in front of a cluster.
var sluiceAddr string

// startExampleNode starts the examples' node and returns its stop.
func startExampleNode() (stop func(), err error) {
	cfg := node.DefaultConfig()
	cfg.NodeName = "example"
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", ""
	cfg.Durability, cfg.DataDir = "memory", ""
	cfg.Engine.Actors = 2
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Start(); err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	sluiceAddr = n.GRPCAddr()
	return func() { n.Shutdown(context.Background()) }, nil
}

// A client per process, shared by every goroutine; one check per request.
func Example() {
	cfg := client.DefaultConfig()
	cfg.Addr = sluiceAddr
	cfg.Timeout = time.Second // for the test run's sake; the default 20 ms is the one to keep
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Connect(context.Background()); err != nil {
		log.Fatal(err) // no point starting without Sluice; or go on, failing open
	}

	// Three requests a minute per user.
	check := client.Check{Key: "user:42", Limit: 3, Window: time.Minute}
	for range 4 {
		d, err := c.Check(context.Background(), check)
		if err != nil {
			// Sluice did not decide: d is the failure policy's answer
			// (allow, by default). Log it and go on.
			log.Print(err)
		}
		if !d.Allowed {
			fmt.Printf("denied: retry in %v\n", d.RetryAfter.Round(time.Minute))
			continue
		}
		fmt.Printf("allowed, %d remaining\n", d.Remaining)
	}
	// Output:
	// allowed, 2 remaining
	// allowed, 1 remaining
	// allowed, 0 remaining
	// denied: retry in 1m0s
}

// The login rule: one call limits a login form per client IP and per
// submitted username, all or nothing, so that a username over its limit
// does not spend the IP's allowance (and the other way round).
func ExampleClient_CheckAll() {
	cfg := client.DefaultConfig()
	cfg.Addr = sluiceAddr
	cfg.Timeout = time.Second // for the test run's sake; the default 20 ms is the one to keep
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.Connect(context.Background()); err != nil {
		log.Fatal(err)
	}

	login := func(ip, user string) bool {
		ds, err := c.CheckAll(context.Background(), []client.Check{
			{Key: "login:ip:" + ip, Limit: 20, Window: time.Hour, OnFailure: client.FailClosed},
			{Key: "login:user:" + user, Limit: 2, Window: 15 * time.Minute, OnFailure: client.FailClosed},
		})
		if err != nil {
			log.Print(err)
		}
		return ds[0].Allowed && ds[1].Allowed
	}
	fmt.Println(login("192.0.2.7", "alice"))
	fmt.Println(login("192.0.2.7", "alice"))
	fmt.Println(login("192.0.2.7", "alice")) // alice is over her limit
	fmt.Println(login("192.0.2.7", "bob"))   // the IP is not: nothing was spent on it
	// Output:
	// true
	// true
	// false
	// true
}

// With Sluice unreachable, a check is decided by its failure policy, and
// the decision says so.
func ExampleFailClosed() {
	cfg := client.DefaultConfig()
	cfg.Addr = "127.0.0.1:1" // nothing listens there
	// A deadline a loaded machine meets: the refusal comes at once, but
	// with the default 20 ms a slow dial would end as a timeout.
	cfg.Timeout = time.Second
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	for _, policy := range []client.Policy{client.FailOpen, client.FailClosed} {
		d, err := c.Check(context.Background(), client.Check{Key: "k", Limit: 10, Window: time.Second, OnFailure: policy})
		fmt.Printf("%v: allowed %v, source %v, failure %v, error %v\n", policy, d.Allowed, d.Source, d.Failure, err != nil)
	}
	// Output:
	// open: allowed true, source failure, failure unreachable, error true
	// closed: allowed false, source failure, failure unreachable, error true
}

// A batch of independent checks, say one per item of a bulk request: each
// is decided on its own, in one call per node when the client routes, and
// the decisions come back in the order of the checks.
func ExampleClient_CheckEach() {
	cfg := client.DefaultConfig()
	cfg.Addr = sluiceAddr
	cfg.Timeout = time.Second
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var checks []client.Check
	for _, tenant := range []string{"acme", "globex", "initech"} {
		checks = append(checks, client.Check{Key: "bulk:" + tenant, Limit: 2, Window: time.Minute, Cost: 2})
	}
	checks = append(checks, client.Check{Key: "bulk:acme", Limit: 2, Window: time.Minute}) // acme again: its 2 are spent
	ds, err := c.CheckEach(context.Background(), checks)
	if err != nil {
		log.Print(err) // some checks were not decided: their decisions are their failure policy's
	}
	for i, d := range ds {
		fmt.Println(checks[i].Key, d.Allowed, d.Remaining)
	}
	// Output:
	// bulk:acme true 0
	// bulk:globex true 0
	// bulk:initech true 0
	// bulk:acme false 0
}

// A client of a cluster given every node's address sends each check to the
// node that decides its key (see "Checks go to their owners").
// RoutingOff would send them all to the first address that answers.
func ExampleConfig_routing() {
	cfg := client.DefaultConfig()
	cfg.Addr = "sluice-0.sluice:8081,sluice-1.sluice:8081,sluice-2.sluice:8081"
	// Or one address (a Service) and: cfg.Routing = client.RoutingOn
	c, err := client.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	d, err := c.Check(context.Background(), client.Check{Key: "user:42", Limit: 100, Window: time.Minute})
	if err != nil {
		log.Print(err)
	}
	fmt.Println(d.Allowed, d.Source) // SourceOwner: decided by the node the client called
}
