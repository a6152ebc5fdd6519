package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor"
)

// TestForwardToClosedPeerFailsFast: a check that picked a peer's sender
// just before the sender was closed (the peer's address changed, or the
// router is closing) fails at once with ErrUnreachable; it does not wait
// for a deadline it may not even have.
func TestForwardToClosedPeerFailsFast(t *testing.T) {
	r, err := NewRouter(RouterConfig{Self: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := testMap(5, live("a", 1), live("b", 2))
	m.Members[1].Addrs.Peer = "127.0.0.1:1" // never dialled: nothing is sent
	r.own.Store((&ownership{}).next(newConfig("a", PolicyExact, 1, m), 1))
	p, err := r.peers.get("b")
	if err != nil {
		t.Fatal(err)
	}
	p.close()
	done := make(chan error, 1)
	go func() {
		checks := []actor.Check{{Key: "k", Limit: 1, Window: time.Second, Cost: 1}}
		done <- r.forward(context.Background(), r.own.Load(), "b", checks, make([]actor.Decision, 1), nil, false)
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("forward to a closed peer = %v; want ErrUnreachable", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("forward to a closed peer still waiting after 2s")
	}
}
