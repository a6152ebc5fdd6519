// Package testkit holds what the tests of every package share: polling for
// a condition until a deadline ([Eventually], [Wait]) and a buffer that many
// goroutines may write to at once ([SyncBuffer]).
//
// Tests poll; they do not sleep. A test that waits for something to happen
// asks for that thing with [Eventually] (or [Wait] on a goroutine other than
// the test's), and a test that needs a rate-limit window to pass advances
// the injected fake clock. The few sleeps left in the tests say, in a
// comment beside them, why they are not polls.
//
// Only tests import this package. It imports nothing of the module's, so
// that the tests of any floor (persist to cmd, and the public client) may
// use it; cmd/sluice's TestImportsPointDown keeps it so (a package with no
// floor must not import one).
//
// Everything here is safe for concurrent use; [Eventually] must be called
// from the test's goroutine, as t.Fatal must.
package testkit
