// Package persist is the storage layer under the limiter actors: one bbolt
// data file per node, with a write-ahead log (WAL) in front of it. Commits
// are sequential appends to the WAL; a checkpoint writes what the WAL holds
// into the data file, many commits at once.
//
// # What it owns
//
// A Store owns the data file and its WAL files: their lock, their format,
// and every write to them. It stores, for each key, an opaque value (the
// actor package encodes the key's state; persist never decodes it) and a
// deadline, the time at which that state becomes empty; a commit replaces
// a key's value, deletes it, or appends bytes to it. It deletes records
// whose deadline has passed when asked to (Sweep), and says when the
// earliest deadline is (NextDeadline, DeadlineChanged), so that the engine
// can arm one timer for the whole store. persist imports nothing from the
// rest of Sluice.
//
// # Commits, the overlay and checkpoints
//
// All writes go through one writer goroutine, started by Open and ended by
// Close. Actors Submit small batches of records; the writer blocks until
// something is queued, takes everything queued (up to Options.MaxTxRecords
// records; if the queue runs dry before that, it yields once and drains
// it again, so that the goroutines ready to run can add theirs), encodes it
// as one WAL frame, appends the frame to the WAL file with one write(2)
// (and fdatasync in ModeFsync), applies the records to the overlay, then
// acknowledges every batch of that commit in submission
// order, and starts over at once. While a commit is written, the next
// batches queue up and share the next one: the busier the store, the larger
// the frames, so the cost of a write (and of an fsync) is paid once for many
// decisions.
//
// The overlay is an in-memory map from key to the latest record committed
// since the last checkpoint, deletions included (an append to a key it
// holds adds to its entry; to another key, it holds the appended bytes as a
// tail over the older value: see Appends). Get reads it first, then
// the data file: a record is visible to Get once its commit is done. A
// checkpoint freezes the overlay (a new, empty one takes the commits that
// follow, in a new WAL file), and a second goroutine, the checkpointer,
// writes the frozen overlay into bbolt (the keys bucket and the deadline
// index) in key order, in transactions of 4096 keys, records in the last
// one the WAL position it reached, removes the WAL files it came from, and
// drops the frozen overlay; until then Get reads the current overlay, then
// the frozen one, then bbolt. A bbolt transaction holds every node it
// touches and every page it dirties in memory until it commits, about 6 KiB
// a key when keys are spread over a large file: the split bounds that to
// about 24 MiB, and, the keys being in order, rewrites each page about once
// as one transaction would. Each transaction but the last records how far
// it got (the "partial" meta record, below), so that a crash between two of
// them replays the WAL records only of the keys the data file lacks.
// Commits go on while a checkpoint runs. Coalescing is the point: a key
// written fifty times between checkpoints costs bbolt one put.
//
// A checkpoint starts when the overlay holds Options.CheckpointKeys keys
// (default 262144; the node sets it to its --max-keys, at least 4096, so
// that the cap on keys in memory bounds the overlays too), when its entries
// take Options.CheckpointMemory bytes (default 64 MiB, about 200 bytes a key
// plus values longer than an entry holds inline: a put's value is whole,
// and a long sliding log's is a few KiB; a tail holds its bytes only), or
// when the WAL
// written since the last one reaches
// Options.CheckpointBytes (default 256 MiB); when Scan is called (it reads
// the data file, after a checkpoint of what is committed); and in Close.
// Nothing starts one on a timer. If a checkpoint still runs when the next
// one is due, the writer waits for it: memory holds two overlays at most,
// and since a key's entry holds only its latest record, an overlay's size
// follows CheckpointKeys and CheckpointMemory, not the WAL's. If a checkpoint fails, its overlay
// stays (read by Get, kept in the WAL) and the next checkpoint writes it
// again; Flush reports the failure once.
//
// # Failed commits
//
// A commit that cannot be written (a full disk, an I/O error) fails every
// batch in it: nothing of it is in the WAL (a partly written frame is
// truncated away) or the overlay, so Get, checkpoints and a replay never
// see it, and the writer goes on with the next commit. Failures are
// logged at most once a second, with their count, and the first commit
// that succeeds again says how many failed. A batch submitted with
// SubmitAfter builds on an earlier one (an append to the value it wrote, a
// put of a state that includes its records): if that one failed, this one
// is not written either, and fails with the same error, even if the disk
// works again by its turn, so that a caller chaining its batches knows
// that nothing it submitted after a failure reached the store, until it
// submits a batch that builds on none. Such a batch keeps its place in the
// queue (done callbacks run in submission order) and costs the writer no
// write. Options.WriteFault lets tests fail writes at will.
//
// Get runs on the caller's goroutine, holding the overlay's lock for
// reading while it looks keys up (the writer takes it for writing while it
// applies a commit), then in a bbolt read transaction for the keys not
// found. Scan runs in a read transaction after its checkpoint. Callbacks
// passed to Submit run on the writer goroutine and must not block;
// callbacks passed to Get and Scan must be quick and must not wait for the
// writer.
//
// # Appends
//
// A record is a put, a deletion, or an append (Record.Append): bytes to add
// at the end of the key's value, and the key's new deadline. The actor
// package's sliding log holds up to hundreds of runs and a hit adds one:
// with a put, the WAL bytes of a hit would grow with the log; with an
// append, they are the run's. The WAL holds the appended bytes, and so
// does the overlay.
//
// The writer applies an append to the key's entry in the current overlay,
// growing its value in place (amortized, an append costs its own size).
// For a key that overlay does not hold, it looks up the latest value: the
// frozen overlay's, else the data file's, which it reads before it writes
// the frame, in one read transaction for all such keys of the frame. If
// there is one, the new entry is a tail: the appended bytes alone, over
// that value, which stays where it is. Get joins them (a tail in the
// current overlay may go over one in the frozen overlay, over the data
// file's value), and so does the checkpoint, which reads the old value
// anyway. A long value is thus rewritten once per checkpoint, by the
// checkpoint, and the overlay's memory follows the bytes appended: copied
// into the overlay at each key's first append, 10,000 sliding logs of
// 6.7 KB filled CheckpointMemory on their own, and checkpoints came five
// times a second, each rewriting 64 MB of values for 2 MB of WAL.
//
// The value beneath a tail does not change while the tail is in an
// overlay: the frozen overlay is read-only, and is dropped only once its
// checkpoint is in the data file, by the writer itself, between commits; a
// Sweep leaves the records of keys the overlays hold. Only the checkpoint
// of the frozen overlay rewrites them, so a Get that read a tail there may
// find it in the data file already: it reads the WAL position and the
// "partial" meta record in the same transaction, which tell whether the
// data file holds that overlay's value of the key. A checkpoint that
// failed half way and is tried again leaves out the keys the partial
// record says it wrote, whose tails are in the data file already.
//
// A key with no value (never written, deleted, or swept) stores the
// appended bytes alone. So does a value that the append would make longer
// than MaxValueLen: the append is in the WAL already and its commit cannot
// fail, and bbolt refuses a longer value; the store logs the first such
// append. The caller makes the appended bytes a valid value on their own,
// does not mind losing a deleted or swept value, and bounds the growth of
// its values (the actor rewrites a log with a put now and then).
//
// The data file's part of a Sweep pass runs concurrently with commits and
// deletes expired records whose key the overlays do not hold. An append to
// such a key, whose value it reads from the data file, could add to a value
// the pass deletes right after, and a replay after a crash would then find
// no value where the store had shown the concatenation. While a pass may
// still run, the writer therefore commits, before an append, a deletion of
// a key it read from the data file with a deadline not after the pass's
// time (the pass was queued first, and would delete it): the append stores
// its bytes alone, live and in a replay.
//
// An append may instead be conditional (Record.IfLive): written only if the
// key then holds a value whose deadline is after IfLive. The writer decides
// it before it encodes the frame, following the frame's records in order
// from the values the overlays hold and readBases read (the lookups an
// append makes anyway), and leaves the others out of the frame, so that a
// replay never sees them; Commit.Skipped lists them. A standby's copies use
// it: a tail that arrives where the copy holds nothing is refused, and its
// sender sends the whole state.
//
// # Durability modes
//
//   - ModeCommit (default): a batch is acknowledged once its frame is
//     written to the WAL file (write(2), no fsync). It survives kill -9 of
//     the process at any point, a checkpoint included: the kernel holds the
//     written pages, and a frame the crash cut short was never acknowledged
//     (Open ignores it). A power loss or kernel crash may lose what the
//     kernel had not flushed, and may leave a WAL or data file that Open
//     refuses (ErrFormat).
//   - ModeFsync: acknowledged after the frame is written and fdatasync'ed.
//     It survives power loss: a new WAL file is fsynced, with its directory,
//     before a frame goes into it, and a checkpoint is fsynced (bbolt's own
//     two-step sync: data pages, then the meta page) before the WAL files it
//     replaces are removed. A new data file's directory is synced too.
//   - ModeAsync: the store writes exactly as in ModeCommit; the engine
//     acknowledges decisions without waiting for their Commit. On kill -9 it
//     loses what was queued (at most Options.MaxQueue batches) and the
//     frame being written; Submit blocks when the queue is full, which is
//     what bounds that window.
//
// In every mode Close commits what is queued, checkpoints everything into
// the data file, syncs it and removes the WAL files, so a graceful shutdown
// loses nothing and leaves no WAL behind.
//
// # WAL files, format version 2
//
// The WAL of the data file PATH is a sequence of files PATH.wal.GGGGGGGG,
// G the generation, in decimal, zero-padded: a checkpoint starts the next
// generation. Each file is a header and frames, little-endian:
//
//	header  "SLUICWAL" | uint32 version (2) | uint32 0                  16 bytes
//	frame   uint32 length of the body | uint32 CRC-32C (Castagnoli) of the body
//	body    uint64 sequence number | uint32 record count | records
//	record  byte 1 (put) | uvarint key length | key | int64 deadline (unix ns)
//	                     | uvarint value length | value
//	        byte 2 (delete) | uvarint key length | key
//	        byte 3 (append) | uvarint key length | key | int64 deadline (unix ns)
//	                        | uvarint value length (> 0) | value
//
// Sequence numbers follow each other across files. A frame is one commit:
// all of it is replayed, or none. The deletions of a Sweep are records like
// any other, so a replay does not bring swept records back.
//
// Version 1 is version 2 without appends: this build writes version 2 and
// replays files of both (an append in a version 1 file is ErrFormat). A
// build that reads version 1 only refuses the WAL files of this one:
// downgrade only after a clean Close, which leaves no WAL file.
//
// # Open and replay
//
// Open checks the data file (below), then reads every WAL file whose
// generation is past the one the data file records (older ones were
// checkpointed and are removed), checking every frame's checksum and
// sequence number, before it writes anything. The last frame of a file may
// be torn: cut short or zeroed, with no intact frame after it; it was never
// acknowledged, and is ignored. A last frame that is complete but fails its
// checksum was acknowledged and damaged since: ErrFormat, unless
// Options.AcceptWALLoss drops it. A file with a torn or damaged end is
// renamed to .torn or .damaged after the replay, not removed. A frame that fails
// its checksum while an intact later frame follows, frames missing, a bad
// header or an unknown WAL version is ErrFormat, naming the file and the
// frame's offset, with the WAL and the data file left as they were (moving
// the WAL files aside starts from the last checkpoint, losing their
// records). Records apply in order to a replay overlay; an append adds to
// that overlay's value of its key if it holds an entry for it (after a
// deletion, to nothing), else to the data file's value, read in a read
// transaction that ends before anything is written, else to nothing, with
// the writer's rule for values that would be too long. Then the records are
// written into bbolt in one transaction, synced, the WAL files removed, and
// a new WAL generation started. Replay runs at about 250 MiB of WAL a
// second.
//
// # Data file layout, format version 1
//
// The data file is a bbolt database with three buckets:
//
//	meta    "format"  → uint32 big-endian format version (1)
//	        "wal"     → uint64 big-endian generation, uint64 sequence number:
//	                    the last WAL frame written into the file
//	        "partial" → uint64 big-endian generation, key: a checkpoint of
//	                    the WAL up to that generation, cut short after it
//	                    wrote every key up to this one (in byte order); the
//	                    replay skips their records in those files
//	        "seal"    → uint64 big-endian: the ID of the last seal
//	                    transaction (below)
//	        "run"     → byte 1 if the last run closed cleanly, else 0 |
//	                    byte its Mode | its boot id (empty if unknown):
//	                    how the last process stopped (below)
//	keys    key → [8-byte big-endian deadline, unix ns][value]
//	expiry  [8-byte big-endian deadline][key] → empty
//
// and, created on their first write, meta buckets "meta:NAME" for small
// records written by people, outside the group-commit writer (PutMeta, see
// meta.go; "meta:overrides" holds the admin API's overrides). The "wal" key
// is read only by builds with a WAL; a build without one opens the file, but
// ignores WAL files: downgrade only after a clean Close.
//
// expiry indexes the records by deadline, so that Sweep finds the expired
// ones in time order, from the start of the index, without loading a record
// or touching a key that has not expired. Its entries are lower bounds:
// every record has an entry at or before its deadline. A checkpoint reads
// each record's stored deadline: a new record gets an entry; a deadline that
// moves later (what a hit does) changes nothing in the index; one that moves
// earlier, and a deletion, delete the entry at the old deadline (and the
// former inserts one at the new). A Sweep that reaches an entry whose record
// lives on moves it to the record's deadline, and drops one whose record is
// gone. So a key written at every checkpoint costs the index one move per
// deadline that passes, not a deletion and an insertion per checkpoint: the
// old entries of the keys rewritten are spread over the whole index, and
// deleting them visited pages all over it, at a cost that grew with the file
// (without them a node spends 11% less CPU per decision at a million fresh
// keys, 19 to 28% less once every key is in use; see docs/benchmarks.md). A
// checkpoint writes the records in key order, then the index deletions, then
// the insertions in deadline order, and a Sweep inserts the entries it moves
// in deadline order after its walk: bbolt splits nodes only at commit, and
// entries inserted in random order at the index's growing ends would cost
// quadratic time. Builds before the lower bounds kept the index exact; they
// read such a file, but their Sweep drops an entry whose record's deadline
// differs without moving it: after a downgrade, a record rewritten since its
// entry was written is not swept until it is rewritten again.
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
// An older build ignores "partial": after a crash in the middle of a
// checkpoint, open the file with this build (or a later one) first.
//
// Verify (sluice data verify) reads a file as the page walk of Open does,
// read-only, without bbolt, but goes on past each damaged subtree, and
// hands every record of the keys bucket to a check of the caller's (the
// actor package decodes the value): it lists every damaged page and
// record instead of stopping at the first.
//
// # Meta pages and seals
//
// bbolt keeps two meta pages and writes transaction t's at page t%2; on
// open it takes the newer valid one. A damaged newest meta page would make
// it start on the transaction before, silently: whatever the newest one
// wrote would be gone, acknowledged records included, once the WAL files a
// checkpoint replaced are removed. So every write whose loss would matter
// is followed, before it is acknowledged and before any WAL file it
// replaces is removed, by a seal: a transaction that only writes its own ID
// under "seal". These writes are the last transaction of a checkpoint or a
// replay, a Sweep transaction that deleted something, a meta record, and a
// compacted copy (sealed before its rename); Open seals the file too. The
// newest transaction of a file is then never an acknowledged write, and the
// one before it holds every acknowledged write.
//
// The page walk at open checks both meta pages (magic, version, checksum,
// page size). If one is damaged, the file is accepted only when the valid
// one proves that nothing acknowledged is lost: its tree holds "seal" equal
// to its own transaction ID (it is a seal) or to the ID before (it is the
// write right after a seal, so the damaged page is that write's seal, an
// older page, or a write not yet acknowledged). The open then logs one
// warning naming the damaged page, and its seal rewrites it. Otherwise
// (say, a file last written by a build without seals) Open refuses the file
// with ErrFormat naming the page and its bytes, without modifying it.
// TestMetaPageDamageLosesNothing flips every 4-byte window of both meta
// pages of a file written in three sessions: each copy opens with every
// acknowledged record. A file downgraded to a build without seals and
// upgraded again after it wrote, then damaged, is beyond this proof: the
// older build's writes look like writes after a seal.
//
// # How the last process stopped
//
// Open reads the "run" record, then writes its own: the kernel's boot id
// (Options.BootID), the Mode, not closed; it syncs it, whatever the mode,
// before it returns. Close writes it again, closed, after the last
// checkpoint is synced and only if nothing failed. The next Open tells
// from it how that run stopped (Store.LastStop): StopFresh (no record: a
// new file, or one last written by an older build), StopClean, StopCrash
// (not closed, same boot id: the process died and the kernel kept what it
// wrote) or StopReboot (not closed, and another boot id, or one unknown
// then or now: a power loss or kernel crash is possible). With the mode
// the record holds, LastStop.MayHaveLost says whether acknowledged writes
// may be missing: after StopReboot in ModeCommit and ModeAsync, after
// StopCrash in ModeAsync. Open refuses a record it cannot read
// (ErrFormat). An older build ignores the record and leaves it as it was:
// after a downgrade and an upgrade, it describes the last run of a build
// that keeps it.
//
// # Compaction
//
// bbolt reuses the pages records free, but never gives them back: after a
// flood of keys has expired, the file keeps the size of the flood. After a
// checkpoint or a Sweep pass, when the free pages pass
// Options.CompactMinFree (default 16 MiB) and outnumber the pages in use,
// the checkpointer copies every bucket into PATH.compact (bbolt's Compact,
// pages full, in transactions of 4 MiB), syncs it, renames it over the data
// file and syncs the directory; reads switch to the new file. So the file
// holds at most about twice what its records need, plus bbolt's growth
// step of 16 MiB. Reads go on during the copy; meta records wait for it,
// and so does a checkpoint that falls due (and the commits after it): it
// costs about the size of the live records at the disk's speed, 0.7 s for
// 6 MB on the development VM. A crash before the rename leaves PATH.compact,
// which Open removes; a failed compaction (a full disk) is logged and not
// tried again for a minute.
//
// # Deadlines and Sweep
//
// NextDeadline is the earlier of the overlays' earliest deadline and the
// first entry of the data file's index. Each overlay keeps a heap of its
// deadlines whose items are lower bounds: a put that moves a key's deadline
// later does not touch the heap; an item that reaches the top is pushed
// again at its key's deadline if that moved, or dropped if the key was
// deleted. The top is thus exact, at a cost of about one push and one pop
// per key and deadline that passes, however often the key is written. The
// data file's index holds lower bounds the same way (above), so its first
// entry can be earlier than the truth: the Sweep it wakes moves entries
// and deletes nothing. When the overlay rewrote a record that expired in
// the data file, a Sweep drops its index entry and leaves the record to
// the checkpoint that rewrites it, which indexes it again (its old
// deadline is one a Sweep has passed; a replay indexes every record it
// writes).
//
// A Sweep pass first takes the overlays' expired records from their heaps
// and commits their deletions through the WAL, at most 10000 per commit,
// on the writer; then the checkpointer deletes the data file's expired
// records, walking the index from its start, at most 10000 per transaction.
//
// # bbolt options
//
// Options.Timeout is always set (Options.OpenTimeout), so a second process
// on the same file fails with ErrLocked instead of hanging. NoSync is set
// except in ModeFsync (the WAL makes commits durable; a checkpoint in
// ModeCommit needs no more than the page cache). NoFreelistSync is set:
// commits do not write bbolt's freelist (fewer pages per transaction); Open
// rebuilds it by walking the file, which it reads anyway. FreelistType is
// the hash map freelist, whose allocations do not slow down as the file
// fragments. InitialMmapSize is 1 GiB of address space (not memory): a
// remap in the middle of a checkpoint would copy every node it touched to
// the heap. The expiry bucket splits pages 90% full, as it grows at its
// ends. bolt.DefaultOptions is never used or modified.
//
// # Measured costs
//
// On the 2-vCPU development VM, medians of three runs of BenchmarkSubmit:
// 100k keys already in the data file, values of 64 bytes, many goroutines
// each waiting for its own commits; checkpoints run during the runs of 10
// and 100 records a batch (before the WAL, each commit was a bbolt
// transaction):
//
//	records/s       ModeCommit            ModeFsync
//	batch of        bbolt      WAL        bbolt      WAL
//	1               22k        630k       6.5k       90k
//	10              34k        1.09M      10.8k      428k
//	100             51k        1.31M      32.7k      931k
//
// The writer spends about 1 µs per record (encoding, the overlay) plus one
// write(2) per frame, and in ModeFsync one fdatasync (about 0.3 ms there)
// per frame, whatever its size. A checkpoint of 100k keys that rewrites
// every page of the file costs about 6 µs per key (BenchmarkCheckpoint),
// divided among the writes of each key since the last checkpoint. In the
// engine (BenchmarkEngine, 100k keys, 1 or 10 checks a call), ModeCommit
// decides 300k and 630k checks a second where the same build without a
// store decides 370k and 1.1M; it decided 31k and 48k before the WAL.
//
// BenchmarkSubmitLog stores hits on long sliding logs, 100k keys holding 2
// KiB values, either as puts of the whole value (2084 WAL bytes a record,
// with a key of 24 bytes) or as appends of an 8-byte run (43 bytes);
// records/s on 2026-12-05, medians of three runs of appends in ModeCommit,
// one run otherwise (puts move by a quarter from run to run):
//
//	records/s       ModeCommit            ModeFsync
//	batch of        put        append     put        append
//	1               72-99k     598k       41-49k     135k
//	10              95-117k    1.47M      51-58k     572k
//
// Puts of 2 KiB spend their time writing the WAL and checkpointing it
// (every 256 MiB). Appends write as little as puts of 64 bytes; the first
// append to each key after a checkpoint looks its value up in bbolt. Before
// tails, when that append copied the value into the overlay, the same
// appends ran at 61k and 71k records/s in ModeCommit, 35k and 43k in
// ModeFsync: 200 MB of copied values filled CheckpointMemory again and
// again.
//
// # No periodic work
//
// Nothing in this package runs on a timer. When nothing is queued, the
// writer goroutine sleeps on its queue and the checkpointer on its jobs; an
// idle store costs nothing, whatever the number of keys, and its last
// records stay in the WAL (and the overlay) until the next checkpoint or
// Close. Expired records are deleted only when the engine calls Sweep, and
// it knows when to call it from NextDeadline and DeadlineChanged, not by
// polling.
package persist
