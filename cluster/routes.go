package cluster

import "cmp"

// Route is one member of the ownership as a client that routes its own
// checks sees it: the client hashes a key over the names of Routes (the
// same rendezvous order as config.order) and sends its checks to the
// first member that is up. A check that reaches another node is
// forwarded from there, so a client's stale view costs a hop, never a
// wrong decision.
type Route struct {
	// Name is the member's name, which ownership hashes.
	Name string
	// Addr is where it serves the decisions API (its gRPC address, as
	// gossip carries it now, else as the cluster map recorded it); "" when
	// neither knows it.
	Addr string
	// Up reports that it owns keys and its epoch is live: it decides its
	// keys now.
	Up bool
}

// Routes returns the ownership this node routes under, for clients: its
// version (the configuration: the map version of the last membership
// change) and the members a key's rendezvous order runs over, sorted by
// name. A single node returns version 0 and itself, without an address.
func (r *Router) Routes() (uint64, []Route) {
	own := r.own.Load()
	if !r.joined() || own == nil {
		return 0, []Route{{Name: r.cfg.Self, Up: true}}
	}
	view := r.members().View()
	return own.cur.id, own.cur.routes(func(name string) string {
		if m, ok := view.Member(name); ok {
			return m.GRPCAddr
		}
		return ""
	})
}

// routes lists the configuration's ring as Routes does; addr gives a
// member's address as gossip knows it now ("" when it does not), else
// the map's is used.
func (c *config) routes(addr func(string) string) []Route {
	out := make([]Route, len(c.ring))
	for i, name := range c.ring {
		out[i] = Route{Name: name, Addr: cmp.Or(addr(name), c.members[name].Addrs.GRPC), Up: c.up(name)}
	}
	return out
}

// RoutesVersion returns the version of the ownership this node routes
// under, as Routes does, without building the list: cheap enough to put on
// every answer.
func (r *Router) RoutesVersion() uint64 {
	own := r.own.Load()
	if !r.joined() || own == nil {
		return 0
	}
	return own.cur.id
}
