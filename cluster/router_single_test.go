package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor"
)

// TestRouterBeforeJoin: a router is built before the node joins anything
// (the node builds it in New): a single node's decides every check on its
// engine, in this node's name; a cluster node's refuses every check
// (ErrNoQuorum) until Join, owns every key for the engine's fencing, and
// copies nothing.
func TestRouterBeforeJoin(t *testing.T) {
	ctx := context.Background()
	checks := func() []actor.Check {
		return []actor.Check{{Key: "k", Limit: 1, Window: time.Minute, Cost: 1}}
	}
	for _, clustered := range []bool{false, true} {
		r, err := NewRouter(RouterConfig{Clustered: clustered, Self: "a"})
		if err != nil {
			t.Fatal(err)
		}
		e, err := actor.New(actor.Config{Actors: 1, Owner: r, Replicator: r})
		if err != nil {
			t.Fatal(err)
		}
		r.SetEngine(e)
		out, nodes := make([]actor.Decision, 1), make([]string, 1)
		err = r.Check(ctx, checks(), out, nodes, false)
		switch {
		case clustered && !errors.Is(err, ErrNoQuorum):
			t.Errorf("clustered, before Join: Check = %v; want ErrNoQuorum", err)
		case clustered && !errors.Is(r.Joining(), ErrNoQuorum):
			t.Errorf("clustered, before Join: Joining() = %v; want ErrNoQuorum", r.Joining())
		case !clustered && (err != nil || !out[0].Allowed || nodes[0] != "a"):
			t.Errorf("single node: Check = %v, %+v decided by %q; want allowed by a", err, out[0], nodes[0])
		case !clustered && r.Joining() != nil:
			t.Errorf("single node: Joining() = %v; want nil", r.Joining())
		}
		if !r.Decidable("k") || r.Joined() || r.Peers() != nil {
			t.Errorf("clustered %t: Decidable %t, Joined %t, Peers %v; want true, false, none", clustered, r.Decidable("k"), r.Joined(), r.Peers())
		}
		replicated := make(chan error, 1)
		r.Replicate(nil, func(err error) { replicated <- err })
		if err := <-replicated; err != nil {
			t.Errorf("clustered %t: Replicate before Join = %v; want nil", clustered, err)
		}
		if err := r.Join(nil, nil); err == nil {
			t.Errorf("clustered %t: Join(nil, nil) = nil; want an error", clustered)
		}
		e.Close()
		r.Close()
	}
}
