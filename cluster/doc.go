// Package cluster runs Sluice's cluster: gossip membership, the data plane
// that routes each check to the member that acts for its key, moves key
// state between members and keeps standby copies, and the wiring of the
// control plane (package cluster/control, the cluster map in Raft) into
// both.
//
// # Membership
//
// A Membership runs hashicorp/memberlist (SWIM gossip with Lifeguard's
// refinements) for this node. It finds the other nodes, carries their
// addresses, Raft IDs, cluster IDs and settings in the node metadata, and
// suspects failures; it decides nothing about ownership. Nodes are
// identified by Config.NodeName, never by address: a node that restarts
// from another address keeps its name and its keys. Gossip is encrypted
// and authenticated when Config.GossipKey is set. Start binds the gossip
// port, then joins Config.Join, resolving DNS names and retrying with
// backoff (see Membership.Join), so a Kubernetes headless Service name
// works as the join list. Membership implements control.Gossip.
//
// # Ownership
//
// Who acts for a key and who keeps its copy are pure functions of the
// cluster map (control.Map): rendezvous (highest random weight) hashing of
// the key over the owners (the map's members in phase joined, up or down)
// orders them; the key's acting member is the first whose epoch is live,
// walking past members whose epoch ended with complete copies elsewhere
// (releasable); its standby is the next live one. A configuration is the
// map at one membership change; two nodes at the same configuration agree
// on every key. See ownership.go and docs/cluster.md.
//
// # The data plane
//
// A Router decides checks on the member that acts for their keys: this
// node's engine, or a peer through PeerService (this package holds both
// sides of that protocol and the meaning of each status code: Status). It
// decides only under this node's lease (control.Control.LeaseValid),
// checked before the actors decide and again before answering. Key state
// moves between nodes like a token (handoff.go): a node that stops acting
// for a key fences its actors (actor.Engine.Fence), hands the key to its
// new acting member, deletes it only once that member committed it, and
// then tells every member it holds nothing more for it; a node that gains a
// key waits for those completes. With standbys (replica.go) every write is
// copied to the key's standby before it is acknowledged, and a member
// records in the map, once per configuration, that its standbys are up to
// date (its synced mark), which lets its keys go on from their copies when
// its epoch ends. Every peer message carries the sender's map version (the
// receiver applies at least that version first) and epoch; copies never go
// back. The protocol, its proof and its timing assumptions are in
// docs/cluster.md.
//
// # Concurrency
//
// All methods are safe for concurrent use. Memberlist calls back into the
// Membership with its node lock held; those callbacks take only the
// Membership's state lock, and no code calls memberlist while holding it.
// Observer methods run in those callbacks and must not block. The
// Router's locks and their order are listed on the Router type.
package cluster
