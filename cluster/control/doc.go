// Package control is Sluice's control plane: every decision about the
// cluster that must never diverge is an entry of one Raft log
// (hashicorp/raft), applied by every node in the same order to the cluster
// map (Map): the members with their Raft IDs, addresses, phases and epochs,
// whether an ended epoch left complete copies of its keys (Releasable),
// each member's synced mark, tombstones of members forgotten without
// copies, the cluster-wide settings, and the partitions' records. The
// state machine reads nothing but the entries (no clock): see fsm.go.
//
// When the settings ask for partitions (partition.go), a key's partition
// is a function of the key, and each partition's record names its
// replicas, its leader (the one member that decides its keys) and its
// in-sync set, fenced by epochs that the state machine checks on every
// change. The Raft leader sets the records once the first members are
// live, every replica in sync, and gives a replica list that fell short
// the members PlanReplicas puts there; a partition's leader proposes its
// own changes (Transfer, Reclaim, ChangeISR, and the targets of
// LeaveWith). The data plane reads the records from the map
// (PartitionLeader, LeaderOf, Led).
//
// A Control is one node's part: its Raft server (its log, vote and ID in
// raft.db, bbolt; the transport on the node's peer port behind a Mux, with
// TLS and a handshake that proves the peer secret and names the cluster),
// its epoch (one per process start, taken through the log), and its lease,
// renewed with the leader every L/4 and timed on CLOCK_BOOTTIME. The
// leader answers renewals after a Raft barrier, ends the epoch of a member
// that stopped renewing (or that gossip has not seen alive for a lease)
// once its lease is over for sure, initialises a new cluster, adds the
// nodes gossip finds, keeps voters placed and places partitions. Every
// node of a first start bootstraps with the identical configuration, or
// none does: see bootstrap.go.
//
// Gossip (package cluster's Membership) only finds members and suspects
// failures: Control sees it through the small Gossip interface. Nodes reach
// the leader through their peer service (PeerService.Renew and Propose),
// whose server passes the calls to HandleRenew and HandlePropose.
//
// docs/cluster.md gives the argument for why at most one node decides a
// key, and every timing assumption it rests on.
//
// # Concurrency
//
// Control's methods are safe for concurrent use. The map is immutable and
// read without locks (Map, Watch). Raft calls the state machine from one
// goroutine. The granter (leader only) serialises grants behind its own
// lock; the lease holder's fields are atomic.
package control
