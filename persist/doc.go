// Package persist is the storage layer under the limiter actors: one bbolt
// data file per node, written by one goroutine doing group commit.
//
// # What it owns
//
// A Store owns the data file: its lock, its format, and every write to it.
// It stores, for each key, an opaque value (the actor package encodes the
// key's state; persist never decodes it) and a deadline, the time at which
// that state becomes empty. It deletes records whose deadline has passed when
// asked to (Sweep), and says when the earliest deadline is (NextDeadline,
// DeadlineChanged), so that the engine can arm one timer for the whole store.
// persist imports nothing from the rest of Sluice.
//
// # Concurrency
//
// All writes go through one writer goroutine, started by Open and ended by
// Close. Actors Submit small batches of records; the writer blocks until
// something is queued, takes everything queued (up to
// Options.MaxTxRecords records), writes it in one bbolt transaction,
// commits, then acknowledges every batch of that transaction in submission
// order, and starts over at once. While a transaction commits, the next
// batches queue up and share the next transaction: the busier the store, the
// larger the transactions, so the cost of a commit (and of an fsync in
// ModeFsync) is paid once for many decisions.
//
// Get and Scan run on the caller's goroutine in their own read transactions,
// concurrently with each other and with the writer; they see committed
// records only. Callbacks passed to Submit run on the writer goroutine and
// must not block; callbacks passed to Get and Scan run inside a read
// transaction and must not wait for the writer.
//
// # Durability modes
//
//   - ModeCommit (default): a batch is acknowledged once its transaction is
//     written to the file (write(2), no fsync). It survives kill -9 of the
//     process, since the kernel holds the written pages. A power loss or kernel
//     crash may lose what the kernel had not flushed and, since bbolt writes
//     pages without ordering them on disk, may leave a file that Open refuses
//     (ErrFormat).
//   - ModeFsync: acknowledged after the transaction is written and
//     fdatasync'ed, by bbolt's own two-step sync (data pages, then the meta
//     page that makes them current). It survives power loss. A new file's
//     directory is synced too.
//   - ModeAsync: the store writes exactly as in ModeCommit; the engine
//     acknowledges decisions without waiting for their Commit. On kill -9 it
//     loses what was queued (at most Options.MaxQueue batches) and the
//     transaction being written; Submit blocks when the queue is full, which
//     is what bounds that window.
//
// In every mode Close commits what is queued and syncs the file, so a
// graceful shutdown loses nothing. BenchmarkSubmit measures the cost of
// ModeCommit and ModeFsync.
//
// # On-disk layout, format version 1
//
// The file is a bbolt database with three buckets:
//
//	meta    "format" → uint32 big-endian format version (1)
//	keys    key → [8-byte big-endian deadline, unix ns][value]
//	expiry  [8-byte big-endian deadline][key] → empty
//
// and, created on their first write, meta buckets "meta:NAME" for small
// records written by people, outside the group-commit writer (PutMeta, see
// meta.go; "meta:overrides" holds the admin API's overrides).
//
// expiry indexes the records by deadline, so that Sweep finds the expired
// ones in time order, from the start of the index, without loading a record
// or touching a key that has not expired; and NextDeadline is its first
// entry. Every write keeps it exact: a put reads the stored record's deadline,
// deletes the old index entry if the deadline moved and inserts the new one;
// a deletion removes both. Sweep still deletes a record only if its stored
// deadline equals the index entry's.
//
// Open creates a new file with the meta bucket. It refuses, with ErrFormat
// and without modifying it, a file that bbolt cannot open, a bbolt file
// without the meta bucket (or with other buckets missing), or with a format
// version this build does not know. Before opening an existing file for
// writing, Open reads it once, read-only, from end to end (every key of every
// bucket, checking their order), so that a corrupt or truncated file is
// reported as ErrFormat rather than crashing the process inside bbolt. With
// bbolt's own walk to rebuild its freelist, opening costs about a third of a
// second per million records. A file that is a bbolt database with no
// bucket at all (its creation was interrupted) is initialised. A later
// format changes the version, and this package will then either migrate the
// file explicitly or refuse it; it never wipes it.
//
// # bbolt options
//
// Options.Timeout is always set (Options.OpenTimeout), so a second process
// on the same file fails with ErrLocked instead of hanging. NoSync is set
// except in ModeFsync. NoFreelistSync is set: commits do not write bbolt's
// freelist (fewer pages per transaction); Open rebuilds it by walking the
// file, which it reads anyway. FreelistType is the hash map freelist, whose
// allocations do not slow down as the file fragments. The expiry bucket
// splits pages 90% full, as it grows at its end. bolt.DefaultOptions is never
// used or modified.
//
// # No periodic work
//
// Nothing in this package runs on a timer. When nothing is queued, the
// writer goroutine sleeps on its queue; an idle store costs nothing,
// whatever the number of keys. Expired records are deleted only when the
// engine calls Sweep, and it knows when to call it from NextDeadline and
// DeadlineChanged, not by polling.
package persist
