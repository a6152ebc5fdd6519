package cluster

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// In a cluster, admin calls are answered as if there were one node: a key's
// state comes from its owner, listings cover every node, and overrides are
// set on every node. The node that receives a call does the fan-out through
// AdminPeers; the calls it makes carry ReplicatedHeader so that they are
// answered locally.

// ReplicatedHeader marks an admin call that another member made, naming
// it: the receiver answers it for itself, without fanning it out again.
const ReplicatedHeader = "x-sluice-replicated"

// Replicated reports whether ctx is an admin call another member made.
func Replicated(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(ReplicatedHeader)) > 0
}

// AsReplicated returns ctx as an admin call received from the member
// named from: a copy applied here, not fanned out again.
func AsReplicated(ctx context.Context, from string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs(ReplicatedHeader, from))
}

// AdminPeers reaches the admin services of the other members, for the
// admin calls a node answers for the whole cluster: a key's state from its
// owner, listings from every member, overrides copied to every member. A
// single node, or one that has not joined, has no peers: every call is
// answered locally.
type AdminPeers struct {
	r     *Router
	token string
}

// NewAdminPeers returns the admin peers of r's cluster; adminToken is the
// token the members' admin services require ("" for none).
func NewAdminPeers(r *Router, adminToken string) *AdminPeers {
	return &AdminPeers{r: r, token: adminToken}
}

// Context returns ctx for an admin call to another member: the admin token
// and the replicated mark naming this node.
func (a *AdminPeers) Context(ctx context.Context) context.Context {
	kv := []string{ReplicatedHeader, a.r.cfg.Self}
	if a.token != "" {
		kv = append(kv, "authorization", "Bearer "+a.token)
	}
	return metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...))
}

// Conn returns a connection to the admin service of the live member name
// (see Router.AdminConn).
func (a *AdminPeers) Conn(name string) (*grpc.ClientConn, error) {
	return a.r.AdminConn(name)
}

// Client returns an admin client for the live member name.
func (a *AdminPeers) Client(name string) (sluicepb.AdminServiceClient, error) {
	conn, err := a.r.AdminConn(name)
	if err != nil {
		return nil, err
	}
	return sluicepb.NewAdminServiceClient(conn), nil
}

// KeyOwner returns an admin client for key's owner when that is another
// member and the call (ctx) did not come from one; nil means answer
// locally. Before the node joined its cluster, it is the Joining error.
func (a *AdminPeers) KeyOwner(ctx context.Context, key []byte) (sluicepb.AdminServiceClient, error) {
	if err := a.r.Joining(); err != nil {
		return nil, err
	}
	if Replicated(ctx) {
		return nil, nil
	}
	owner, remote := a.r.Owner(string(key))
	if !remote {
		return nil, nil
	}
	return a.Client(owner)
}

// Others returns the names of the other live members, to fan a call out
// to; none for a single node or a call (ctx) that came from another
// member.
func (a *AdminPeers) Others(ctx context.Context) []string {
	if Replicated(ctx) {
		return nil
	}
	return a.r.Peers()
}
