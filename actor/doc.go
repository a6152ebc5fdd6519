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
// # Failed commits
//
// A failed commit records nothing: its calls get the store's error, and
// their hits are counted neither in memory nor on disk. Since the actor
// decides on top of writes in flight, each of its writes builds on the one
// before while that one is in flight (persist.Store.SubmitAfter), so a
// failure fails every later write of the chain without it reaching the
// store. Before its next batch the actor drops the keys of those writes
// from memory (settle, rollback): they load again from the store, as they
// were before the failure. The store's writer notes the failure for the
// actor before it fails the calls, so a caller that retries finds its hits
// gone. In async mode the hits were acknowledged: they stay, and the keys
// are written again, whole, once writes succeed (pin).
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
// # Handoff and fenced calls
//
// When keys move to another node, Collect reads the state of every key that
// moved, changing nothing, and once the new owner has committed those
// states (Import), Forget deletes each of them here unless it changed since
// Collect read it. A handoff cut short at any point (a cancelled context, a
// closing engine, a full mailbox) leaves each hit here, on the new owner,
// or on both (counted twice, which only denies more), never on neither.
// A state imported again (a retry after the receiver committed, or a newer
// version of it) into a key it was added up with adds only what it holds
// beyond what was taken in, through a receipt the key keeps in memory,
// rather than adding up again; and Collect splits such a key's state by
// history (Exported.Parts), so that the node that handed a history over
// and kept it joins it instead of counting it twice (see importStates and
// docs/engine.md, "Imported again" and "Handed back").
//
// A call may carry the ownership generation its caller read before routing
// it (CallOptions.Generation). Fence moves the generation on. An actor
// deciding its part of a fenced call made at another generation asks
// Config.Owner about the part's keys and, if one moved, refuses the part
// without recording anything (ErrStale). So once the node has published the
// new ownership, called Fence and then Collect, no fenced check on a moved
// key is decided after Collect read it (Collect first waits for the fenced
// all-or-nothing and reserving calls of older generations, which may still
// release what they reserved). A call at the current generation costs the
// actor one atomic load, and an unfenced call nothing.
//
// # Copies: lineage, replication and replica keys
//
// Every key's state carries a lineage, a random number drawn when it
// starts from empty and kept through every change and encoding. Two states
// with the same lineage are copies of one history (the owner's disk and
// its standby's copy), and merge (Import) joins them idempotently, by the
// larger count, so that copies meeting in any order count each hit once;
// states of different or unknown lineages add up, as a handoff's do.
//
// Config.Replicator receives the records of every storage write once the
// store committed them (a failed write is not replicated); in the durable
// modes a call whose hits were written is acknowledged once the Replicator
// confirmed them too (ErrReplication if the Replicator failed; the hits
// stay recorded: they were committed). The actor never waits for either. Another node's records are kept here with PutReplicas,
// under ReplicaPrefix in the same store, read with CollectReplicas and
// deleted with DeleteReplicas. Keys with ReservedPrefix are refused to
// every client call, so no actor holds one and replica writes, which
// bypass the actors, never race them; they are ordered among themselves by
// one lock. List and Collect skip them; the janitor expires them.
//
// A follower of a partition keeps its copies under the keys themselves
// (PutFollower), so that once it leads the partition its actors load them
// from the store like any key on disk. Those writes bypass the actors too,
// on keys an actor may hold: the caller keeps the actors off the keys
// while it follows (it does not lead them, and fenced the engine when it
// stopped), and calls Evict before they decide them again. Evict drops the
// keys from every actor's memory, each once the write that holds its
// latest state is done (the actor waits for that commit), so that the
// next call on one loads what the store holds.
//
// # Usage and reservations
//
// A usage check (Check.Usage) reports hits already spent: they are
// recorded even over the limit, and the key's later checks wait until the
// window has room. A reserving check (Check.Reservation) records its
// estimate at once and leaves a record in the key's state, which a
// settling check later removes, giving back the difference or recording
// the overshoot. Records live in the state (encoded, handed over, copied
// to standbys like hits), expire by the key's deadline and its one alarm,
// and bound a key's memory (MaxReservations).
//
// docs/engine.md describes the algorithms, their error bounds, the
// durability modes, the on-disk format, and copies.
package actor
