package overrides

import (
	"context"
	"errors"

	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Peers reaches the admin services of the other members of a cluster
// (cluster.AdminPeers is one).
type Peers interface {
	// Others names the other live members, none for a call (ctx) that
	// came from one of them.
	Others(ctx context.Context) []string
	// Client returns an admin client for the member name.
	Client(name string) (sluicepb.AdminServiceClient, error)
	// Context is ctx for a call to another member: its credentials and
	// the mark that has it answered there without a fan-out.
	Context(ctx context.Context) context.Context
}

// Replicate applies a change of the overrides on every other member (call
// makes it on one, through its admin client). A member that cannot be
// reached is logged and named in the error; it gets the overrides when
// it next joins (Sync). A change that came from another member (ctx) is
// not copied again.
func (t *Table) Replicate(ctx context.Context, call func(context.Context, sluicepb.AdminServiceClient) error) error {
	if t.peers == nil {
		return nil
	}
	var errs []error
	for _, name := range t.peers.Others(ctx) {
		client, err := t.peers.Client(name)
		if err == nil {
			err = call(t.peers.Context(ctx), client)
		}
		if err != nil {
			t.log.Warn("admin: replicate override", "to", name, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sync copies the overrides of another member, so that a node that joins
// (or returns) applies the same overrides as the others: apply sets each
// one here (as the admin API's SetOverride does), with a context that
// marks it as a copy from that member (cluster.AsReplicated). The node
// calls it once it joined.
func (t *Table) Sync(ctx context.Context, apply func(context.Context, *sluicepb.Override) error) {
	if t.peers == nil {
		return
	}
	for _, name := range t.peers.Others(ctx) {
		client, err := t.peers.Client(name)
		if err != nil {
			continue
		}
		token := ""
		for {
			resp, err := client.ListOverrides(t.peers.Context(ctx), &sluicepb.ListOverridesRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				t.log.Warn("admin: copy overrides", "from", name, "err", err)
				break
			}
			for _, o := range resp.Overrides {
				o.SetAt = nil
				if err := apply(cluster.AsReplicated(ctx, name), o); err != nil {
					t.log.Warn("admin: copy override", "from", name, "err", err)
				}
			}
			if token = resp.NextPageToken; token == "" {
				return
			}
		}
	}
}
