// Package actor decides rate-limit checks exactly, one goroutine per group
// of keys.
//
// # Actors
//
// An Engine runs Config.Actors goroutines. shard.Index maps each key to one
// of them, and that actor is the only code that ever reads or writes the
// key's state, so key state has no locks. A call (Engine.Check) carries a
// batch of checks: the caller computes each check's actor, hands the call to
// every actor that owns one of its keys through that actor's bounded
// mailbox, and waits for all of them. A full mailbox fails the call at once
// with ErrOverloaded instead of blocking; the caller's context bounds the
// wait.
//
// An actor takes a call from its mailbox, then drains whatever else is
// waiting (up to Config.MaxDrain calls) and decides them as one batch: the
// keys it lacks are loaded in one read transaction, every check is decided
// in arrival order, and the keys that changed go to the store as one write.
// In the default durability mode a call is acknowledged only once the write
// holding its hits has committed; the actor does not wait for that commit
// and goes on with the next batch.
//
// # Alarms
//
// Each key in memory has a deadline: the moment its last recorded hit leaves
// the window, after which its state is empty. Each actor keeps its keys'
// deadlines in a heap and arms one timer for the earliest; when it fires,
// empty keys leave memory. A key written after its alarm was armed is armed
// again for its new deadline when the old one fires; a key whose state is
// empty is never armed. Deadlines of keys on disk live in the store's
// deadline index, and the engine's janitor arms one timer for the earliest
// of those. There is no periodic work: with no key due, no goroutine wakes.
//
// # Memory
//
// Each actor holds at most Config.MaxKeys/Config.Actors keys. Past that, the
// least recently used keys leave memory; their state is on disk and is
// loaded again, before any decision, the next time they are touched. Without
// a store (memory mode) nothing can be evicted without losing hits, so a new
// key past the bound fails with ErrTooManyKeys.
//
// docs/engine.md describes the algorithms, their error bounds, the
// durability modes and the on-disk format.
package actor
