// Package testkit holds what the tests of every package share: polling for
// a condition until a deadline ([Eventually], [Wait]), a buffer that many
// goroutines may write to at once ([SyncBuffer]) and the last lines of a
// log ([Tail]).
//
// Tests poll; they do not sleep. A test that waits for something to happen
// asks for that thing with [Eventually] (or [Wait] on a goroutine other than
// the test's), and a test that needs a rate-limit window to pass advances
// the injected fake clock. The few sleeps left in the tests say, in a
// comment beside them, why they are not polls.
//
// Only tests and test harnesses (cluster/clustertest, node/nodetest)
// import this package. It imports nothing of the module's and sits on the
// ground floor of docs/architecture.md (cmd/sluice's TestImportsPointDown
// holds it there), so that the tests of every floor, and of the public
// client, may use it.
//
// Everything here is safe for concurrent use; [Eventually] must be called
// from the test's goroutine, as t.Fatal must.
package testkit
