// Package faults is the fault-injection suite of Sluice's cluster: it runs
// the built sluice binary as a cluster of three (or five) nodes on a
// private network, injects a fault under steady load, proves the fault
// happened, and holds what the clients were told against what every copy
// of every key holds once the fault has healed. The package holds no code
// of its own, only this description and its tests.
//
// # What a scenario does
//
// Each scenario starts a fresh cluster. Every node runs in its own Linux
// network namespace, linked by a veth pair to a bridge in a "switch"
// namespace, with two addresses in a /24 of 10.0.0.0/8 picked at random
// for the run (the second serves only what a scenario binds to it: the
// peer service, for the cut that gossip does not see, or gossip, for the
// cut of gossip alone). Beside each node
// runs its edge client, in the test process: its connections are opened
// inside the node's namespace and reach the node on 127.0.0.1, as a
// sidecar's would, so cutting a node off the network does not cut it off
// from its own client.
//
// The clients send a paced load (cost 1, sliding log, a deadline of 1 s)
// on three kinds of keys, 16 of each:
//
//   - limited keys, 40 hits an hour, checked from the start at about 25 a
//     second each: they reach their limit within the first seconds and
//     must be denied from then on, so a node that decides one from lost or
//     reset state allows it again;
//   - fresh keys, checked from one second before the fault (so that each
//     has a copy on its standby when the fault strikes) at about 15 a
//     second each, with a limit of what they get in the fault's length and
//     two seconds more at the pace the load kept so far: they are under
//     their limit while the fault lasts, so two nodes deciding one at once
//     both allow it, and once the fault has healed they go three times as
//     fast and reach their limit (the scenario waits up to 5 s more for
//     that);
//   - ledger keys, a billion hits per 10 minutes, checked from the start
//     at about 25 a second each: never denied, their hits are the ledger;
//   - edge keys, a window of 2 s and limits from 6 to 13 (two keys each),
//     checked from the start at about 7 a second each (14 a window): from
//     their first seconds on they are always within a few hits of their
//     limit, through every fault and every handover, so a second decider,
//     or a decision from a state short by a single hit, allows more than
//     the limit in some window. Their copies are not held against the
//     ledger (their hits expire within seconds); their calls are: the
//     most allowed calls certainly decided within one window (the last
//     reply less than a window after the first send) must not exceed the
//     limit.
//
// That is about 800 checks a second, 112 on edge keys, and 240 more on
// fresh keys (their limits and the checks a second are in each
// scenario's log). After 2 s
// of load the fresh keys enter, a second later the scenario injects its
// fault, heals it, lets the load run 3 s more, stops it, and waits
// (up to 60 s) until the cluster has settled: every running node ready
// and seeing every other alive, two rounds of peeks (cost-0 checks) at
// every key through every node giving the same count and deciding node,
// and every copy of every key agreeing (below).
//
// # What it checks
//
// Every call records its key, its client, when it was sent and answered,
// what it was told and, when allowed or denied, the deciding node
// (Decision.node). A failed call records its status, and whether it may
// have recorded its hit: every failure may, except an UNAVAILABLE whose
// errdetails.ErrorInfo says recorded "no" (cluster.MetaRecorded: a refusal
// made before anything was recorded) and a call that could not connect to
// its node at all. A row fails if any of these does not hold:
//
// The fault happened. A cut node's client was refused at least once while
// the fault lasted (or, if its node went on deciding alone, the node
// listed the others down); a paused node's process was seen stopped
// (state T in /proc) and its client got no answer while it was; a killed
// node's process exited; the other nodes listed the victim other than
// alive (ListMembers, polled every 200 ms) at least once, when they are a
// majority of the nodes (a minority's view is only reported: memberlist
// confirms failures through other members, and a lone node slows its own
// detection down); for the cut of the peer address alone, the others kept
// the victim alive in gossip and their clients saw failed calls; a node
// that must refuse to join exited non-zero with a line naming the setting
// and both values. With setLink a no-op, the partition rows fail here.
//
// S1: one decider. Decision d happened at some instant within [sent(d),
// replied(d)], all on the test process's one monotonic clock. The check
// fails on allowed decisions a1, b, a2 of one key, a1 and a2 by node A and
// b by another node, with
//
//	replied(a1) + δ < sent(b),  replied(b) + δ < sent(a2),  replied(a2) − sent(a1) < H
//
// (δ = 2 ms, H = 300 ms): b was certainly decided after a1 and before a2,
// and a1 and a2 less than H apart. The key cannot legitimately have moved
// from A to B and back in that time: every handover passes either a fence
// (the old holder's lease must have lapsed: L·(1+ρ) = 2.2 s) or a node's
// departure and return (a process start, a lease round, the others'
// completes: above a second in every run). So the check passes every
// handover, a rolling restart's A to B and back to A included, and slow
// calls only hide overlaps; two nodes deciding a key for more than a few
// of its decisions (the load decides each key every 40 to 70 ms) show as
// A, B, A. With the lease check disabled in a build, the partition rows
// fail here.
//
// Keys over their limit: no limited, fresh or edge key allowed more than
// its limit in its window (for edge keys, in the window of their calls
// described above).
//
// Keys denied below their limit, reported and not failed: denials made
// while fewer calls than the limit were allowed or may have recorded a
// hit in the window that ends at the denial. Hits counted twice (a state
// added up from two histories, a late copy applied again) show here, and
// so do the denials a forgotten member's tombstone makes on purpose.
//
// S2: nothing acknowledged lost, nothing counted that no call recorded.
// Each copy of each key is held against its calls at every instant: with
// r(t) the node's rounding of a hit's time (up to window/1000 for a limit
// above 1,000: 600 ms for ledger keys; none for the others), at every T,
//
//	#{allowed c: r(replied c) + δ ≤ T}  ≤  hits the copy holds at or before T
//	                                     ≤  #{c allowed or ambiguous: r(sent c) − δ ≤ T}
//
// (ambiguous: failed, and may have recorded its hit). At the end of time
// this is allowed ≤ used ≤ allowed + ambiguous; at every instant, it also
// catches a lost hit that an unacknowledged one makes up for in the total,
// which the check before (allowed − used, one way) missed. A limited key
// that went over its limit is checked for the excess only (its log keeps
// its newest limit+1 hits). The table reports both sides: acknowledged
// hits lost, and hits counted beyond the ambiguous calls.
//
// S2 while the load runs. Every decision says what its state counted
// (limit − remaining, its own hit included when allowed): that must be
// at least the calls allowed and answered before the decided call was
// sent. So a node that decided from a copy lacking acknowledged hits shows
// at the moment it decided, even if a later handoff or merge repaired the
// copy before the end. For every key but edge keys; a decision at the
// limit (remaining 0) only says it counted at least the limit. Not held in
// rows that document an excess (a key decided from nothing).
//
// Every copy agrees. After the fault, for every key, the node that decides
// it (its peek's Decision.node) is read locally (AdminService.GetKey with
// local: its own state, never forwarded), and so is its standby (the next
// member in the key's rendezvous order, package shard, among the owners
// ListMembers lists) for its standby copy: the two must count the same as
// the peeks, and each is held against the ledger. States and copies held
// by other nodes are logged.
//
// # Scenarios
//
// TestFaults runs the single faults, each on three nodes (--expect 3, a
// standby per key) unless marked: rolling SIGTERM restarts, every node
// joining node 1 (as scripts/cluster-up.sh does) or all of them (as the
// headless Service of scripts/k8s does), in which no node may be fenced; a
// partition (node 2's link down); a pause (SIGSTOP of node 2); a one-way
// cut (nodes 1 and 3 drop what they send to node 2, which still reaches
// them); a kill -9 of node 2 with its return on the same data dir, and on
// an empty one; and, with --owner-policy available, the kill and the
// partition again. The rows that cut, pause or kill node 2 require another
// node to have decided, while the fault lasted, keys node 2 decided before
// it. The lease-only rows run --owner-policy available with one copy,
// where only the lease keeps one decider (they allow the one extra limit a
// window that configuration documents): a partition; pauses of 0.9, 1.0,
// 1.1 and 1.3 leases, each right after a granted renewal; and a partition
// of a node whose lease clock runs at 0.95 of real time
// (--test-lease-clock-rate, within ρ).
//
// TestDoubleFaults runs the double faults and operator mistakes of issue
// 19, which broke the hand-made control plane that came before Raft. On
// five nodes
// (--expect 5): the owner and the standby of every key (keys chosen by
// their rendezvous order) cut off together, reaching each other; the
// standby of every key paused and its owner killed -9; nodes 4 and 5
// started with --expect 5 during a rolling restart of nodes 1 to 3 that
// raises their --expect from 3 to 5. On three: with --replicas 1, node 2
// paused and forgotten (AdminService.ForgetMember) 4 s into the pause,
// then resumed; node 3 started with a stale --expect 1, then cut off; node
// 3 started with --replicas 1 beside nodes with 2, which must refuse to
// join, exit non-zero and name the setting and both values, the others
// going on unaffected; node 2 killed -9 with its disk wiped while node 3
// is paused; node 2's peer address (--peer-addr on the second address)
// cut one way, gossip still flowing; the fresh keys first checked at the
// very moment node 2 is cut off (the partition row lets them in a second
// before, so that they have copies); the Raft leader paused, and cut
// off; node 2 cut off and, half way through, killed -9 with its disk
// wiped; every node stopped at once with SIGTERM, and killed -9 at once;
// nodes 1 and 2 cut off from each other only; a follower stopped with
// SIGTERM as the leader is killed -9; a second process under node 2's
// name; and the keys of nodes 2 and 3, one paused while the other is
// killed and wiped. The leader is the node every running node names as
// such (ListMembersResponse.leader); a row fails if they do not agree.
//
// TestOperatorFlows runs the operator flows and the control plane's own
// faults: forget-then-replace and forget-then-return (with --replicas 1,
// the runbook's replacement of a dead node, and a forgotten member's keys
// meeting a member that returns), a staggered first start of five empty
// nodes with --expect 3, a follower's and the leader's gossip cut alone, a
// node of another cluster merging into gossip, the leader frozen while a
// node starts its epoch, and a standby's lane stalled across an epoch
// change. TestChurn is a seeded random nemesis over five nodes (see its
// doc).
//
// Each scenario reports, as one row of the table its test prints at the
// end (the shape of docs/cluster.md's "What each failure costs"), what it
// checked, the keys over their limit and the worst of them, the keys with
// evidence of two deciders, the acknowledged hits lost and the hits
// counted beyond the ambiguous calls (keys, worst), how long each key was
// refused, and the errors by code. Refusal is measured two ways: the time
// covered by a key's failed calls (the union of their [sent, replied]
// intervals), and the time during which some client went without an
// answer for the key (from a failed call to that client's next answer).
// The first undercounts a node that refuses connections at once, whose
// calls fail in microseconds; the second does not.
//
// # Running it
//
//	sudo go test ./cluster/faults -v
//	sudo go test ./cluster/faults -run TestDoubleFaults -v
//
// The suite needs root (to create network namespaces) and iproute2's ip.
// It uses only ip netns, veth pairs, a bridge, addresses, link up and
// down, blackhole routes, and tc's token bucket filter for the slow and
// lossy links: no netem or iptables (this machine's kernel has no netem,
// so latency and loss come from a queue that fills). It touches nothing
// in the root namespace. Without root or ip, or where ip netns add fails
// (a container without CAP_SYS_ADMIN), and under -short, the tests skip
// with one line saying why. Scenarios run two at a time, each in its own
// namespaces. On two cores the whole suite takes about seven minutes after
// the build; every wait is polled against a deadline, so a busy machine
// makes it slower, not wrong. The bugs the suite must catch are in
// scripts/mutants.
//
// Environment:
//
//   - SLUICE_FAULT_SECONDS: how long each fault lasts (default 6, longer
//     than failure detection, about 2.4 s, and a lease, 2 s, together); a
//     killed node stays down 2/3 of it.
//   - SLUICE_FAULT_PARALLEL: how many scenarios run at once (default 2).
//   - SLUICE_FAULT_FLAGS: extra flags for every node's sluice serve,
//     separated by spaces (for example "--log-level debug"), after the
//     harness's own extra flags and before a scenario's flags for one
//     node.
//   - SLUICE_FAULT_LOGS: a directory where a failed scenario leaves each
//     node's whole log (TestFaults_partition-n1.log...), for a closer look.
//
// Pick scenarios with -run, for example -run 'TestFaults/partition'.
//
// The test process builds the binary once into a temporary directory
// (with -race when the tests run with it: the race detector watches the
// nodes, and a race it reports fails the scenario) and removes it at the
// end.
// Each scenario removes its namespaces and kills its nodes when it ends,
// failed or not. A test binary killed outright (a -timeout panic) may leave
// namespaces named sf????sw and sf????n1..n5 behind: list them with ip
// netns list and remove them with ip netns del.
package faults
