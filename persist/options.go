package persist

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Mode says when a submitted write is acknowledged, and therefore what an
// acknowledged write survives. The zero value is ModeCommit.
type Mode uint8

const (
	// ModeCommit acknowledges a write once the WAL frame holding it has been
	// written to the WAL file with write(2), without fsync. The data is then
	// in the kernel's page cache: it survives kill -9 of the process, but a
	// power loss or kernel crash may lose what the OS had not flushed yet
	// (and may leave a WAL or data file that Open refuses with ErrFormat). It
	// is the default.
	ModeCommit Mode = iota
	// ModeFsync acknowledges a write only after its WAL frame has been
	// written and fdatasync'ed. An acknowledged write survives power loss.
	// Checkpoints into the data file are fsynced too (bbolt's own two-step
	// sync) before the WAL files they replace are removed.
	ModeFsync
	// ModeAsync is for engines that acknowledge a decision without waiting for
	// its write. The store behaves exactly as in ModeCommit (the writer
	// commits continuously, a commit starting as soon as the previous one
	// ends, and done is still called after commit); the mode only tells the
	// engine not to wait. On kill -9 it loses at most what was queued
	// (Options.MaxQueue batches) plus the one commit in flight.
	ModeAsync

	numModes
)

// modeNames is indexed by Mode.
var modeNames = [numModes]string{ModeCommit: "commit", ModeFsync: "fsync", ModeAsync: "async"}

// String returns the mode's name as users type it ("commit", "fsync",
// "async").
func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode returns the mode named s: "commit", "fsync" or "async".
func ParseMode(s string) (Mode, error) {
	for m, name := range modeNames {
		if s == name {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("persist: unknown durability mode %q (want commit, fsync or async)", s)
}

// Defaults of the Options fields that are left zero.
const (
	DefaultOpenTimeout      = time.Second
	DefaultMaxQueue         = 4096
	DefaultMaxTxRecords     = 50000
	DefaultCheckpointKeys   = 256 << 10
	DefaultCheckpointBytes  = 256 << 20
	DefaultCheckpointMemory = 64 << 20
	DefaultCompactMinFree   = 16 << 20
)

// Options configures a Store. The zero value of every field but Path selects
// its default. Open copies Options: changing them afterwards has no effect.
type Options struct {
	// Path is the data file. Missing parent directories are created with
	// mode 0o750; the file itself is created with mode 0o600. Required.
	Path string

	// Mode says when a submitted write is acknowledged. Default ModeCommit.
	Mode Mode

	// OpenTimeout is how long Open waits for the exclusive lock on the file
	// held by another process (or another Store in this process) before it
	// fails with ErrLocked. Default 1s (DefaultOpenTimeout).
	OpenTimeout time.Duration

	// AcceptWALLoss lets Open replay a WAL file whose last frame is
	// complete but fails its checksum (damage, not a torn write: the frame
	// was written in full, and acknowledged): the frames before it are
	// replayed and that one is dropped. Without it Open refuses the file
	// with ErrFormat and changes nothing. Either way the file is kept
	// aside (see Open).
	AcceptWALLoss bool

	// MaxQueue is how many submitted batches (and Flush/Sweep requests) may
	// wait for the writer before Submit blocks. It bounds the memory of the
	// queue and, in ModeAsync, the loss window on kill -9. Default 4096
	// (DefaultMaxQueue).
	MaxQueue int

	// MaxTxRecords is a soft upper bound, in records, of one commit (one WAL
	// frame): the writer stops draining the queue once it has this many (a
	// single batch is never split, so a commit may exceed it by one batch).
	// Default 50000 (DefaultMaxTxRecords).
	MaxTxRecords int

	// CheckpointKeys starts a checkpoint once the records committed since
	// the last one cover this many distinct keys. It bounds the memory of
	// the overlay: two of them at most (one being checkpointed, one
	// filling), of about 200 bytes a key. Default 262144
	// (DefaultCheckpointKeys).
	CheckpointKeys int

	// CheckpointBytes starts a checkpoint once the WAL written since the
	// last one reaches this many bytes. It bounds the WAL on disk (twice
	// this at most) and the time Open takes to replay it after a crash
	// (about a second per 256 MiB); the larger, the more writes of a key
	// one checkpoint coalesces. Memory does not grow with it. Default
	// 256 MiB (DefaultCheckpointBytes).
	CheckpointBytes int64

	// CheckpointMemory starts a checkpoint once the overlay's entries
	// take this many bytes of memory (about 200 bytes a key, plus values
	// longer than 64 bytes: a sliding log of a thousand runs is a few KiB).
	// With CheckpointKeys it bounds the overlays whatever their values:
	// two of them at most. Default 64 MiB (DefaultCheckpointMemory).
	CheckpointMemory int64

	// CompactMinFree is the free space, in bytes, past which the data file
	// is compacted (copied into a new file that replaces it) once its free
	// pages also outnumber the pages in use: a file holds at most about
	// twice what its records need, or this much more. Negative: never
	// compact. Default 16 MiB (DefaultCompactMinFree).
	CompactMinFree int64

	// OnCompact, if set, is called on the checkpointer goroutine after
	// every compaction that succeeded, with the file's size before and
	// after and the wall time it took.
	OnCompact func(before, after int64, d time.Duration)

	// Logger receives the store's logs, with attribute component=persist.
	// Nil discards them.
	Logger *slog.Logger

	// OnCommit, if set, is called on the writer goroutine after every
	// commit (one WAL frame), succeeded or failed, with the number of
	// records it held (submitted records and the deletions of a Sweep step)
	// and its wall time from encoding the frame to the end of the write
	// (including fdatasync in ModeFsync). Meant for metrics: it must return
	// quickly.
	OnCommit func(records int, d time.Duration)

	// OnCheckpoint, if set, is called on the checkpointer goroutine after
	// every checkpoint, with the number of records (distinct keys) it wrote
	// into the data file, its wall time (its bbolt transactions, including
	// fsync in ModeFsync) and its error (nil if it succeeded; a failed
	// checkpoint's records stay in the WAL and the next one writes them).
	// Meant for metrics: it must return quickly.
	OnCheckpoint func(records int, d time.Duration, err error)

	// BootID returns this machine's boot id, which changes at every boot:
	// Open records it, so that the next Open can tell a crash of the
	// process from a reboot (see LastStop). An error or an empty id means
	// unknown, and a run that did not close is then taken as ended by a
	// reboot. Default: the Linux kernel's
	// /proc/sys/kernel/random/boot_id (unknown on other systems). Tests
	// set it to play a reboot.
	BootID func() (string, error)

	// WriteFault is a test hook, for the tests of the packages built on
	// the store: if set, it is called on the writer goroutine before each
	// commit's WAL write, and an error it returns fails that commit as a
	// failed write(2) would (nothing of it is written, and the writer goes
	// on with the next one). It lets a test fill the disk, and empty it
	// again, at will. Production code leaves it nil (the default): no
	// fault.
	WriteFault func() error
}

// DefaultOptions returns Options for the data file at path with every other
// field set to its default.
func DefaultOptions(path string) Options {
	return Options{
		Path:             path,
		Mode:             ModeCommit,
		OpenTimeout:      DefaultOpenTimeout,
		MaxQueue:         DefaultMaxQueue,
		MaxTxRecords:     DefaultMaxTxRecords,
		CheckpointKeys:   DefaultCheckpointKeys,
		CheckpointBytes:  DefaultCheckpointBytes,
		CheckpointMemory: DefaultCheckpointMemory,
		CompactMinFree:   DefaultCompactMinFree,
	}
}

// Validate reports every invalid field of o, joined in one error. Zero values
// are valid (they select the defaults), except for Path.
func (o Options) Validate() error {
	var errs []error
	if o.Path == "" {
		errs = append(errs, errors.New("persist: options: Path is empty (set the data file path)"))
	}
	if o.Mode >= numModes {
		errs = append(errs, fmt.Errorf("persist: options: unknown Mode %d (want ModeCommit, ModeFsync or ModeAsync)", uint8(o.Mode)))
	}
	if o.OpenTimeout < 0 {
		errs = append(errs, fmt.Errorf("persist: options: OpenTimeout %v is negative (use 0 for the default %v)", o.OpenTimeout, DefaultOpenTimeout))
	}
	if o.MaxQueue < 0 {
		errs = append(errs, fmt.Errorf("persist: options: MaxQueue %d is negative (use 0 for the default %d)", o.MaxQueue, DefaultMaxQueue))
	}
	if o.MaxTxRecords < 0 {
		errs = append(errs, fmt.Errorf("persist: options: MaxTxRecords %d is negative (use 0 for the default %d)", o.MaxTxRecords, DefaultMaxTxRecords))
	}
	if o.CheckpointKeys < 0 {
		errs = append(errs, fmt.Errorf("persist: options: CheckpointKeys %d is negative (use 0 for the default %d)", o.CheckpointKeys, DefaultCheckpointKeys))
	}
	if o.CheckpointBytes < 0 {
		errs = append(errs, fmt.Errorf("persist: options: CheckpointBytes %d is negative (use 0 for the default %d)", o.CheckpointBytes, DefaultCheckpointBytes))
	}
	if o.CheckpointMemory < 0 {
		errs = append(errs, fmt.Errorf("persist: options: CheckpointMemory %d is negative (use 0 for the default %d)", o.CheckpointMemory, DefaultCheckpointMemory))
	}
	return errors.Join(errs...)
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.OpenTimeout == 0 {
		o.OpenTimeout = DefaultOpenTimeout
	}
	if o.MaxQueue == 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	if o.MaxTxRecords == 0 {
		o.MaxTxRecords = DefaultMaxTxRecords
	}
	if o.CheckpointKeys == 0 {
		o.CheckpointKeys = DefaultCheckpointKeys
	}
	if o.CheckpointBytes == 0 {
		o.CheckpointBytes = DefaultCheckpointBytes
	}
	if o.CheckpointMemory == 0 {
		o.CheckpointMemory = DefaultCheckpointMemory
	}
	if o.CompactMinFree == 0 {
		o.CompactMinFree = DefaultCompactMinFree
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.BootID == nil {
		o.BootID = readBootID
	}
	return o
}
