// Package cluster runs Sluice's cluster membership, decides which node
// owns each key, and makes sure that at most one node decides a key at any
// moment (fenced ownership).
//
// # Membership
//
// A Membership runs hashicorp/memberlist (SWIM gossip with Lifeguard's
// refinements) for this node. Nodes are identified by Config.NodeName, never
// by address: several nodes share a host by using different ports, and a
// node that restarts from another address keeps its name and its keys.
// Each node gossips its gRPC address, its start time and whether it is
// leaving in memberlist's node metadata; nodes without Sluice metadata are
// refused. Gossip is encrypted and authenticated when Config.GossipKey is
// set, and a node with another key cannot join.
//
// Start binds the gossip port, then joins Config.Join, resolving DNS names
// and retrying with backoff until a member answers (see Membership.Join),
// so a Kubernetes headless Service name works as the join list. Leave
// announces the departure (peers see StateLeaving, then StateLeft);
// Shutdown without Leave looks like a crash to the peers, who declare the
// node dead after failure detection (docs/cluster.md gives the tuning and
// the measured times).
//
// # Views and epochs
//
// Every change of the live members or of their metadata publishes a new
// immutable View behind an atomic pointer: reading it (View, Members,
// Owner) takes no lock. Its Epoch increases with every change. Epochs are
// local to one node and one process; fencing pairs them with member names
// and start times. Subscribe delivers views from a goroutine of the
// Membership, never from memberlist's: memberlist's callbacks only build
// the view and signal, so a slow subscriber cannot stall failure detection.
// A subscriber that falls behind skips to the latest view.
//
// # Ownership
//
// A key's owner is chosen by rendezvous (highest random weight) hashing
// over the owners of a view (View.Owners: the roster's joined members, up
// or down): each member scores the key with
// shard.Score(shard.Hash(key), shard.NodeHash(name)) and the highest score
// wins, ties going to the smallest name. Every node computes owners from
// its own view; nodes with the same members agree. A joining node takes
// about 1/N of the keys, all from the others; a leaving node's keys, and
// only those, spread over the rest. View.Owner costs one mix per member
// and does not allocate.
//
// # Fenced ownership
//
// A Router decides checks on the member that acts for their keys: this
// node's engine, or a peer through PeerService (this package holds both
// sides of that protocol and the meaning of each status code: Status). It
// decides only under a lease granted by a majority of Config.Expect
// (lease.go, fencing.go), checked before the actors decide and again
// before answering. Key state moves between nodes like a token
// (handoff.go): a node that stops acting for a key fences its actors
// (actor.Engine.Fence), hands the key to its new acting member, deletes it
// only once that member committed it, and then tells every member it holds
// nothing more for it; a node that gains a key waits for those completes
// (ownership.go). Under PolicyAvailable a down owner's keys are taken over
// once a majority promised never to grant it a lease again. The protocol,
// its proof and its timing assumptions are in docs/cluster.md.
//
// # Concurrency
//
// All methods are safe for concurrent use. Memberlist calls back into the
// Membership with its node lock held; those callbacks take only the
// Membership's state lock, and no code calls memberlist while holding it.
// Observer methods run in those callbacks and must not block.
package cluster
