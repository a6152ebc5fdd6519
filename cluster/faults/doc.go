// Package faults is the fault-injection suite of Sluice's cluster: it runs
// the built sluice binary as a three-node cluster on a private network,
// injects a fault under steady load, and checks what the clients were told
// against what the cluster counts once the fault has healed. The package
// holds no code of its own, only this description and its tests.
//
// # What a scenario does
//
// Each scenario starts a fresh cluster. Every node runs in its own Linux
// network namespace, linked by a veth pair to a bridge in a "switch"
// namespace, with an address in a /24 of 10.0.0.0/8 picked at random for
// the run. Beside each node runs its edge client, in the test process: its
// connections are opened inside the node's namespace and reach the node on
// 127.0.0.1, as a sidecar's would, so cutting a node off the network does
// not cut it off from its own client.
//
// The three clients send a paced load (about 2,000 checks/s in all, cost 1,
// sliding log, a deadline of about 1 s) on two kinds of keys: limited keys
// (40 hits per hour, so they reach their limit within the first seconds)
// and ledger keys (a limit of a billion per hour: never denied, they count
// the hits the cluster acknowledged). After a few seconds the scenario
// injects its fault, heals it, lets the load run a few seconds more, then
// waits until every node is ready, sees every member alive and gives the
// same, stable answer to a peek (a cost-0 check) on every key.
//
// The scenarios are rolling restarts with SIGTERM (every node joining node
// 1, as scripts/cluster-up.sh does, and every node joining all three, as
// the headless Service of scripts/k8s does), a partition (node 2's link
// down), a pause (SIGSTOP of node 2), a one-way cut (node 1 and node 3 drop
// what they send to node 2, which still reaches them) and a kill -9 of
// node 2 followed by its return on the same data dir.
//
// # What it checks
//
// The cluster is exact if, in every scenario, no limited key allowed more
// than its limit within the hour and no ledger key counts fewer hits than
// its clients were told were allowed (an acknowledged hit is never lost).
// Each scenario reports, as one row of a table that TestFaults prints at
// the end: the keys over their limit and the worst of them, the
// acknowledged hits lost, how long each key was unavailable (the maximum
// and the median over keys) and the errors by gRPC code. Unavailability is
// measured two ways: the time covered by a key's failed calls (the union
// of their [sent, replied] intervals), and the time during which some
// client went without an answer for the key (from a failed call to that
// client's next answer). The first undercounts a node that refuses
// connections at once, whose calls fail in microseconds; the second does
// not.
//
// # Running it
//
//	sudo go test ./cluster/faults -v
//
// The suite needs root (to create network namespaces) and iproute2's ip.
// It uses only ip netns, veth pairs, a bridge, link up and down, and
// blackhole routes: no tc, netem or iptables. It touches nothing in the
// root namespace. Without root or ip, or where ip netns add fails (a
// container without CAP_SYS_ADMIN), and under -short, the tests skip with
// one line saying why. On two cores the whole suite takes about two and a
// half minutes after the build (a minute and a half with
// SLUICE_FAULT_SECONDS=3).
//
// Environment:
//
//   - SLUICE_FAULT_SECONDS: how long each fault lasts (default 15); the
//     kill -9 scenario keeps its node down 10/15 of it. A small value
//     (say 3) runs the suite quickly while developing.
//   - SLUICE_FAULT_FLAGS: extra flags for every node's sluice serve,
//     separated by spaces (for example "--log-level debug"), after the
//     harness's own extra flags.
//   - SLUICE_FAULT_LOGS: a directory where a failed scenario leaves each
//     node's whole log (n1.log...), for a closer look.
//
// Pick scenarios with -run, for example -run 'TestFaults/partition'.
//
// The test process builds the binary once (without -race, whatever the
// tests run with) into a temporary directory and removes it at the end.
// Each scenario removes its namespaces and kills its nodes when it ends,
// failed or not. A test binary killed outright (a -timeout panic) may leave
// namespaces named sf????sw and sf????n1..n3 behind: list them with ip
// netns list and remove them with ip netns del.
package faults
