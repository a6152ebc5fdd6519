package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Errors returned by the store wrap these, so that errors.Is matches them;
// the returned error's message names the file and says what to do.
var (
	// ErrClosed is returned (through Commit.Err, Flush, Get, Scan) once Close
	// has been called.
	ErrClosed = errors.New("persist: store closed")

	// ErrLocked is returned by Open when the data file stays locked by another
	// process, or another open Store, for longer than Options.OpenTimeout.
	ErrLocked = errors.New("persist: data file locked by another process")

	// ErrFormat is returned by Open when the file is not a Sluice data file
	// bbolt can read: not a bbolt file, corrupt or truncated, without the meta
	// bucket, or with a format version this build does not know. The file is
	// left untouched.
	ErrFormat = errors.New("persist: not a readable Sluice data file")
)

// storeError is an error whose message is complete (prefix, path, advice)
// and that matches one sentinel with errors.Is.
type storeError struct {
	msg  string
	kind error
}

func (e *storeError) Error() string { return e.msg }
func (e *storeError) Unwrap() error { return e.kind }

func newError(kind error, format string, args ...any) error {
	return &storeError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// On-disk layout, format version 1; see doc.go.
var (
	bucketMeta   = []byte("meta")
	bucketKeys   = []byte("keys")
	bucketExpiry = []byte("expiry")
	keyFormat    = []byte("format")
)

const formatVersion uint32 = 1

// initialMmapSize is the size of bbolt's first mapping of the data file.
const initialMmapSize = 1 << 30

// Limits of a Record, from bbolt's limits and the layout (the expiry index
// key is the 8-byte deadline followed by the key).
const (
	// MaxKeyLen is the longest Record.Key, in bytes.
	MaxKeyLen = bolt.MaxKeySize - 8
	// MaxValueLen is the longest Record.Value, in bytes.
	MaxValueLen = bolt.MaxValueSize - 8
)

// Record is the stored state of one key, its deletion, or bytes to append
// to its state.
//
// A put (Append false, Value not nil) replaces the key's value. An append
// (Append true) adds Value, which must not be empty, to the end of the key's
// current value, and sets the key's deadline to Deadline: the WAL holds only
// the appended bytes, so a commit costs the size of what it adds, not of the
// whole value. The current value is the latest committed one (the store
// reads the overlays, then the data file). If the key has none (never
// written, deleted, or deleted by Sweep), the stored value is Value alone;
// so is it, with a warning in the log, if the concatenation would be longer
// than MaxValueLen (the commit does not fail: it is in the WAL already).
// The caller chooses values so that both are valid: Value alone must be a
// valid value, losing a deleted or swept value must be harmless, and the
// caller bounds how long its values grow (by a put that rewrites a value
// now and then). The store never decodes a value.
type Record struct {
	// Key is the key, 1 to MaxKeyLen bytes.
	Key string
	// Deadline is the time, in unix nanoseconds, at which the key's state
	// becomes empty and the record may be deleted by Sweep. It must be > 0
	// when Value is not nil; it is ignored for a deletion. An append sets
	// the key's deadline to it, whatever the deadline was.
	Deadline int64
	// Value is the encoded state, opaque to the store. Nil deletes the key
	// (an empty non-nil slice stores an empty value). For an append, the
	// bytes to append: 1 to MaxValueLen of them.
	Value []byte
	// Append makes the record an append of Value to the key's value,
	// instead of a put that replaces it.
	Append bool
	// IfLive, if not 0, makes an append conditional: it is written only if
	// the key holds a value whose deadline is after IfLive as the records
	// before it leave the key (those of its batch, of batches submitted
	// before, the data file's). Otherwise the record is left out of the
	// write, the rest of which goes on, and Commit.Skipped lists it. An
	// append with IfLive 0 to a key that holds nothing stores its bytes
	// alone.
	IfLive int64
}

// Store is a bbolt data file with a write-ahead log in front of it: one
// writer goroutine doing group commit into the WAL, and one checkpointer
// goroutine writing what the WAL holds into the data file. Its methods are
// safe for concurrent use.
type Store struct {
	opts Options // with defaults applied
	log  *slog.Logger

	// db is the data file. The checkpointer replaces it when it compacts
	// the file, holding dbMu for writing; other goroutines read it holding
	// dbMu for reading (view). metaMu keeps the meta records' writes out
	// of a compaction.
	db     *bolt.DB
	dbMu   sync.RWMutex
	metaMu sync.Mutex

	// mu guards closed. Submitters hold it for reading while they send to
	// queue, so that Close (which takes it for writing) closes queue only
	// when no send can happen any more.
	mu     sync.RWMutex
	closed bool
	queue  chan *Commit
	shut   atomic.Bool // the data file is closed: Get fails

	errClosed error // ErrClosed with the path, built once

	// ovMu guards cur and frozen (the pointers, and the entries of cur,
	// which the writer changes). Get reads them holding it for reading.
	ovMu   sync.RWMutex
	cur    *overlay // committed since the last checkpoint
	frozen *overlay // being checkpointed (or whose checkpoint failed), or nil

	nextMu sync.Mutex
	ovNext int64 // earliest deadline in the overlays, 0 if none
	dbNext int64 // earliest deadline in bbolt's index, 0 if none

	// dbEmpty says that bbolt's keys bucket is empty: Get skips it. It is
	// cleared before a checkpoint's overlay is dropped.
	dbEmpty atomic.Bool

	next    atomic.Int64  // NextDeadline
	changed chan struct{} // DeadlineChanged, capacity 1

	ckDone chan ckResult // checkpoint results, to the writer; capacity 1

	w          writer        // used by the writer goroutine only
	ck         checkpointer  // used by the checkpointer goroutine, then by Close
	writerDone chan struct{} // closed when the writer goroutine returns

	// crashOnClose (tests) makes Close leave everything as kill -9 would:
	// no final checkpoint, no sync, the WAL files kept, not marked clean.
	crashOnClose bool

	// How the last run stopped, and its mode (see laststop.go); run is
	// this run's record, which Close writes again, clean.
	lastStop LastStop
	lastMode Mode
	run      runRecord

	closeOnce sync.Once
	closeErr  error
}

// Open opens the data file at o.Path, creating it (and its parent
// directories) if it does not exist, replays the WAL files a crash left
// next to it, starts a new WAL file, and starts the writer and checkpointer
// goroutines. It reads how the last process stopped (LastStop), then
// records this one, not closed, durably, before it returns.
//
// An existing file is read once from end to end before it is opened for
// writing; if it is not a bbolt file, is corrupt or truncated, is a bbolt file
// without the meta bucket, or has an unknown format version, Open returns an
// error matching ErrFormat and leaves the file untouched. Every WAL file is
// read and checked before its records are written into the data file; one
// that is corrupt other than in its last frame (see doc.go) is ErrFormat
// too, and neither it nor the data file is modified. If another process or
// Store holds the file, Open waits up to o.OpenTimeout and returns an error
// matching ErrLocked.
func Open(o Options) (*Store, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	path := o.Path
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("persist: open %s: create its directory: %v (check the data dir path and its permissions)", path, err)
	}
	existed := false
	var repaired string // a damaged meta page the open rewrites, for the log
	switch info, err := os.Stat(path); {
	case err == nil && info.IsDir():
		return nil, fmt.Errorf("persist: open %s: is a directory (the data file path must name a file)", path)
	case err == nil:
		existed = true
		if info.Size() > 0 {
			var err error
			if repaired, err = verifyFile(path, info.Size(), o.OpenTimeout); err != nil {
				return nil, err
			}
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("persist: open %s: %v (check the data dir path and its permissions)", path, err)
	}

	// A compaction cut short by a crash left its copy: the data file is whole.
	if err := os.Remove(compactName(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("persist: open %s: remove an unfinished compaction: %v (check the data dir's permissions)", path, err)
	}
	db, err := bolt.Open(path, 0o600, boltOptions(o))
	if err != nil {
		return nil, openError(path, o.OpenTimeout, err)
	}
	next, pos, err := initFile(db, path)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	prev, found, err := readRun(db, path)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	boot, bootErr := bootID(o)
	s := &Store{
		opts:       o,
		db:         db,
		log:        o.Logger.With("component", "persist", "path", path),
		queue:      make(chan *Commit, o.MaxQueue),
		errClosed:  newError(ErrClosed, "persist: %s: store closed", path),
		changed:    make(chan struct{}, 1),
		ckDone:     make(chan ckResult, 1),
		writerDone: make(chan struct{}),
		cur:        newOverlay(),
		lastStop:   lastStop(prev, found, boot),
		lastMode:   prev.mode,
		run:        runRecord{mode: o.Mode, bootID: boot},
	}
	s.dbNext = next
	if err := s.replay(pos); err != nil {
		_ = db.Close()
		return nil, err
	}
	// Record this run, not closed, now that the replay is done (a refused
	// one leaves the file as it was). writeRun seals what the file holds,
	// which a build without seals may have written: from here on a damaged
	// meta page costs nothing. This also rewrites a damaged meta page that
	// verifyFile accepted.
	if err := writeRun(db, s.run); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("persist: open %s: write the data file: %v (check the disk and its free space)", path, err)
	}
	if bootErr != nil {
		s.log.Info("the boot id is unknown: if this run does not close, the next start will take it as a possible power loss", "err", bootErr)
	}
	if repaired != "" {
		s.log.Warn("the data file's "+repaired+": started on the other meta page, which holds every acknowledged write (sealed), and rewrote the damaged one", "path", path)
	}
	err = db.View(func(tx *bolt.Tx) error {
		s.dbEmpty.Store(isEmpty(tx.Bucket(bucketKeys)))
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("persist: open %s: %v", path, err)
	}
	wal, err := createWAL(path, s.cur.toGen+1, true)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("persist: open %s: create WAL file: %v (check the data dir's permissions and free space)", path, err)
	}
	if !existed {
		// Make the new file's directory entry durable, so that a power loss
		// cannot lose the file itself after commits were fsynced to it.
		if err := syncDir(dir); err != nil {
			_ = wal.Close()
			_ = db.Close()
			return nil, fmt.Errorf("persist: open %s: sync its directory: %v", path, err)
		}
	}
	gen, seq := s.cur.toGen+1, s.cur.lastSeq+1
	s.cur.toGen = 0
	s.cur.gen = gen
	s.next.Store(s.dbNext)
	s.w.init(s, wal, gen, seq)
	s.ck.init(s, gen)
	attrs := []any{"mode", o.Mode.String(), "wal", wal.Name()}
	if s.dbNext != 0 {
		attrs = append(attrs, "next_deadline", time.Unix(0, s.dbNext).UTC().Format(time.RFC3339))
	}
	s.log.Info("opened data file", attrs...)
	go s.w.run()
	go s.ck.run()
	return s, nil
}

// replay writes the records of the WAL files left by the last process into
// bbolt, in one transaction, syncs it and removes the files. pos is the WAL
// position the data file holds already: files up to its generation were
// checkpointed and are only removed. On return s.cur is empty, and its
// toGen and lastSeq are the last generation and sequence number seen.
//
// Every file is read and checked before anything is written: a file that is
// corrupt (see decodeWAL) is ErrFormat, with the data file and every WAL
// file left as they were.
func (s *Store) replay(pos walPos) error {
	path := s.opts.Path
	files, err := listWALs(path)
	if err != nil {
		return fmt.Errorf("persist: open %s: list WAL files: %v (check the data dir's permissions)", path, err)
	}
	ov := s.cur
	ov.toGen, ov.lastSeq = pos.gen, pos.seq
	var (
		replayed []walFile
		frames   int
		records  int
		torn     int
		damaged  int
		aside    = map[string]string{} // WAL files kept aside: the suffix they get
	)
	// Appends add to the values the data file holds, for keys the WAL did
	// not write before them: read them in one transaction, open until the
	// files are all read, and ended before the write (a write transaction
	// that grows the file's mapping waits for every read transaction to
	// end).
	tx, err := s.db.Begin(false)
	if err != nil {
		return fmt.Errorf("persist: open %s: read the data file: %v", path, err)
	}
	rp := replayer{ov: ov, keys: tx.Bucket(bucketKeys), path: path, done: readPartial(tx.Bucket(bucketMeta))}
	defer func() { _ = tx.Rollback() }()
	for _, f := range files {
		if f.gen <= pos.gen {
			continue // checkpointed already
		}
		sc, err := rp.file(f)
		var rerr walReadError
		switch {
		case errors.Is(err, errWALEmpty):
		case errors.As(err, &rerr):
			return fmt.Errorf("persist: open %s: read WAL file %s: %v (check its permissions)", path, f.path, rerr.err)
		case errors.As(err, new(dataFileError)):
			return err
		case err != nil:
			return newError(ErrFormat, "persist: open %s: WAL file %s is corrupt: %v (neither it nor the data file was modified; moving the WAL files aside starts from the last checkpoint, losing the records they hold)", path, f.path, err)
		}
		if sc.damaged > 0 && !s.opts.AcceptWALLoss {
			return newError(ErrFormat, "persist: open %s: WAL file %s ends with a complete frame of %d bytes that fails its checksum: damage, not a torn write, and the records it holds were acknowledged (neither file was modified; to start without them, open with the loss accepted: sluice serve --accept-wal-loss, which keeps the file aside as %s)", path, f.path, sc.damaged, f.path+".damaged")
		}
		switch {
		case sc.damaged > 0:
			aside[f.path] = ".damaged"
		case sc.torn > 0:
			aside[f.path] = ".torn"
		}
		if sc.frames > 0 {
			ov.lastSeq = sc.lastSeq
		}
		ov.toGen = f.gen
		frames += sc.frames
		records += sc.records
		torn += sc.torn
		damaged += sc.damaged
		replayed = append(replayed, f)
	}
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("persist: open %s: read the data file: %v", path, err)
	}
	if rp.long > 0 {
		s.log.Warn("WAL appends would have made values longer than the longest the data file stores: stored the appended bytes alone, dropping the values they were appended to (the caller must bound how long its values grow)", "appends", rp.long, "max_bytes", MaxValueLen)
	}
	if len(replayed) > 0 {
		ov.bytes = 0
		var bw bboltWriter
		next, _, err := bw.writeOverlay(s.db, ov, true, nil)
		if err == nil {
			err = s.db.Sync()
		}
		if err != nil {
			return fmt.Errorf("persist: open %s: replay the WAL into the data file: %v (nothing was removed; check the disk)", path, err)
		}
		s.dbNext = next
		s.log.Info("replayed WAL", "files", len(replayed), "frames", frames, "records", records, "keys", ov.m.len(), "torn_bytes", torn)
		if torn > 0 {
			s.log.Warn("ignored the torn end of a WAL file: a commit interrupted by the crash, never acknowledged", "bytes", torn)
		}
		if damaged > 0 {
			s.log.Warn("dropped the damaged last frame of a WAL file, as accepted: its acknowledged records are lost", "bytes", damaged)
		}
	}
	for _, f := range files {
		if suffix, ok := aside[f.path]; ok {
			// Kept for a closer look, under a name that is not a WAL
			// generation, so that no later open replays it.
			if err := os.Rename(f.path, f.path+suffix); err != nil {
				s.log.Warn("cannot keep a WAL file aside", "file", f.path, "err", err)
			} else {
				s.log.Warn("kept a WAL file aside", "file", f.path+suffix)
			}
			continue
		}
		if err := removeWAL(f.path); err != nil {
			s.log.Warn("cannot remove a replayed WAL file; it will be ignored", "file", f.path, "err", err)
		}
	}
	toGen, lastSeq := ov.toGen, ov.lastSeq
	if n := len(files); n > 0 && files[n-1].gen > toGen {
		toGen = files[n-1].gen
	}
	*ov = *newOverlay()
	ov.toGen, ov.lastSeq = toGen, lastSeq
	return nil
}

// replayer applies the records of WAL files to ov, the replay overlay.
type replayer struct {
	ov   *overlay
	keys *bolt.Bucket // the data file's, in a read transaction
	path string
	long int     // appends that would have made a value too long
	done partial // what an interrupted checkpoint wrote already
}

// dataFileError is an error of the data file met during the replay (which
// verifyFile makes unlikely): its message is complete.
type dataFileError struct{ error }

// file applies the records of the WAL file at name to ov; its first frame
// must follow ov.lastSeq. An append adds to the replay overlay's value of
// its key if it has an entry for it (after a deletion: to nothing), else to
// the data file's value, else to nothing; as on the writer, a value that
// would be longer than MaxValueLen is the appended bytes alone. A record of
// a key whose final value an interrupted checkpoint wrote is skipped.
func (rp *replayer) file(wf walFile) (walScan, error) {
	ov := rp.ov
	f, err := os.Open(wf.path)
	if err != nil {
		return walScan{}, walReadError{err}
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return walScan{}, walReadError{err}
	}
	return decodeWAL(f, info.Size(), ov.lastSeq+1, func(r walRecord) error {
		if rp.done.covers(wf.gen, r.key) {
			return nil
		}
		if r.app {
			e := ov.m.getBytes(r.key)
			if e != nil {
				if !ov.appendTo(e, e.key, r.deadline, r.value, nil, MaxValueLen) {
					rp.long++
				}
				return nil
			}
			base := rp.keys.Get(r.key)
			if base != nil && len(base) < 8 {
				return dataFileError{fmt.Errorf("persist: open %s: record %q is %d bytes, shorter than its deadline (the data file is corrupt)", rp.path, r.key, len(base))}
			}
			if base != nil {
				base = base[8:]
			}
			if !ov.appendTo(nil, string(r.key), r.deadline, r.value, base, MaxValueLen) {
				rp.long++
			}
			return nil
		}
		key := ov.keyOf(r.key)
		if r.del {
			ov.del(key)
		} else {
			ov.put(key, r.deadline, r.value)
		}
		return nil
	})
}

// openError maps an error of bolt.Open to the store's errors.
func openError(path string, timeout time.Duration, err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return newError(ErrLocked, "persist: open %s: locked by another process for more than %v (is another sluice running on this data dir?)", path, timeout)
	case errors.As(err, &pe):
		return fmt.Errorf("persist: open %s: %v (check the data file's permissions)", path, pe.Err)
	default:
		// bbolt could not read its meta pages: ErrInvalid, ErrVersionMismatch,
		// ErrChecksum, a file too small, a page size it cannot use...
		return formatError(path, "bbolt cannot read it: %v", err)
	}
}

func formatError(path, format string, args ...any) error {
	return newError(ErrFormat, "persist: open %s: not a readable Sluice data file: %s (the file was not modified; move it aside or point sluice at another data dir)",
		path, fmt.Sprintf(format, args...))
}

// verifyFile opens the existing file read-only and reads all of it: the
// page tree (checkPages), the format, every record and every index entry. A corrupt page makes bbolt
// panic (or fault on a truncated mapping); here that is caught and reported
// as ErrFormat, where the read-write open would crash the process (bbolt
// rebuilds the freelist on a goroutine that panics on corruption).
//
// A file with one damaged meta page is ErrFormat unless the other one is
// sealed (see seal.go); then verifyFile returns what is damaged, for the
// log.
func verifyFile(path string, size int64, timeout time.Duration) (repaired string, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = formatError(path, "corrupt: %v", p)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return "", openError(path, timeout, err)
	}
	defer func() { _ = db.Close() }()
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Size() > size {
			return formatError(path, "truncated: %d bytes, bbolt expects %d", size, tx.Size())
		}
		damage, err := checkPages(path)
		if err != nil {
			return err
		}
		if damage.page >= 0 {
			if !sealed(tx) {
				return newError(ErrFormat, "persist: open %s: not a readable Sluice data file: %s: bbolt would start on the other meta page (transaction %d), which may lack what the damaged one committed, acknowledged writes included, and nothing in the file proves otherwise (it was last written by a build that does not seal its writes, or in the middle of a checkpoint); refusing rather than rolling back silently (the file was not modified; restore it from a copy, or move it aside to start empty; sluice data verify %s lists the damage)",
					path, damage, tx.ID(), filepath.Dir(path))
			}
			repaired = damage.String()
		}
		if err := checkFormat(tx, path); err != nil {
			if errors.Is(err, errEmpty) {
				return nil
			}
			return err
		}
		return walk(tx, path)
	})
	return repaired, err
}

// errEmpty says that a bbolt file has no bucket at all: a file whose creation
// was interrupted before its meta bucket was committed. Open initialises it.
var errEmpty = errors.New("empty bbolt file")

// checkFormat checks the meta bucket and the buckets of format version 1.
func checkFormat(tx *bolt.Tx, path string) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		if k, _ := tx.Cursor().First(); k == nil {
			return errEmpty
		}
		return formatError(path, "bbolt file without a %q bucket", bucketMeta)
	}
	v := meta.Get(keyFormat)
	if len(v) != 4 {
		return formatError(path, "no format version in the %q bucket", bucketMeta)
	}
	if got := binary.BigEndian.Uint32(v); got != formatVersion {
		return formatError(path, "format version %d; this build reads version %d only (run the sluice release that wrote it)", got, formatVersion)
	}
	for _, name := range [][]byte{bucketKeys, bucketExpiry} {
		if tx.Bucket(name) == nil {
			return formatError(path, "no %q bucket", name)
		}
	}
	return nil
}

// walk reads every page of every bucket (the store's and the meta buckets
// of meta.go) and checks that keys come in order and that records and index
// entries have their shape: bbolt checks the same (and more) when it
// rebuilds its freelist at the read-write open, but panics on what it finds.
func walk(tx *bolt.Tx, path string) error {
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		var prev []byte
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			switch {
			case prev != nil && bytes.Compare(prev, k) >= 0:
				return formatError(path, "bucket %q: key %x after %x, out of order", name, k, prev)
			case bytes.Equal(name, bucketKeys) && len(v) < 8:
				return formatError(path, "record %q is %d bytes, shorter than its deadline", k, len(v))
			case bytes.Equal(name, bucketExpiry) && len(k) < 9:
				return formatError(path, "expiry index entry %x is too short", k)
			}
			prev = k
		}
		return nil
	})
}

// view runs fn in a read transaction of the data file, which a compaction
// replaces between two calls, never during one.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	return s.db.View(fn)
}

// walPos is the WAL position a data file holds: the generation and the
// sequence number of the last frame checkpointed into it (zero if none).
type walPos struct{ gen, seq uint64 }

// initFile checks the format of the open file, initialises a new one, and
// returns the earliest deadline and the WAL position it holds.
func initFile(db *bolt.DB, path string) (next int64, pos walPos, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		if err := checkFormat(tx, path); err != nil {
			return err
		}
		next = firstDeadline(tx.Bucket(bucketExpiry))
		switch v := tx.Bucket(bucketMeta).Get(keyWAL); len(v) {
		case 0:
		case 16:
			pos = walPos{binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])}
		default:
			return formatError(path, "WAL position of %d bytes in the %q bucket; want 16", len(v), bucketMeta)
		}
		return nil
	})
	if !errors.Is(err, errEmpty) {
		return next, pos, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if k, _ := tx.Cursor().First(); k != nil {
			return formatError(path, "bbolt file without a %q bucket", bucketMeta)
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keyFormat, binary.BigEndian.AppendUint32(nil, formatVersion)); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketKeys); err != nil {
			return err
		}
		_, err = tx.CreateBucket(bucketExpiry)
		return err
	})
	if err != nil && !errors.Is(err, ErrFormat) {
		err = fmt.Errorf("persist: open %s: initialise new data file: %v", path, err)
	}
	return 0, walPos{}, err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// firstDeadline returns the deadline of the first index entry, 0 if none.
func firstDeadline(exp *bolt.Bucket) int64 {
	k, _ := exp.Cursor().First()
	if len(k) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(k))
}

// Path returns the data file's path.
func (s *Store) Path() string { return s.opts.Path }

// Mode returns the durability mode the store was opened with.
func (s *Store) Mode() Mode { return s.opts.Mode }

// WALBytes returns the size on disk of the data file's write-ahead log:
// the file being written and those a checkpoint has not yet written into
// the data file. It grows by up to CheckpointBytes between two checkpoints,
// and for as long as checkpoints fail. It reads the directory: meant for
// metrics, not for a hot path.
func (s *Store) WALBytes() (int64, error) {
	files, err := listWALs(s.opts.Path)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, f := range files {
		info, err := os.Stat(f.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Removed by a checkpoint since the listing.
		case err != nil:
			return n, err
		default:
			n += info.Size()
		}
	}
	return n, nil
}

// Get reads the records of keys and calls fn, on the calling goroutine, for
// each key found (i is its index in keys), in no particular order. value is
// valid only during fn and must not be modified: copy it to keep it.
//
// Get sees every committed record: once a Commit is done, Get returns its
// records (or, for a deletion, does not find the key), from the overlay of
// records committed since the last checkpoint, or from the data file; a
// record submitted but not yet done may be invisible. It returns records
// whose deadline has passed but that no Sweep has deleted yet; the caller
// decides what an expired record means. Get is safe to call from many
// goroutines, concurrently with the writer and the checkpointer. fn must be
// quick (for keys found in the overlay it runs while the writer cannot apply
// a commit) and must not call the store or wait for a Commit.
func (s *Store) Get(keys []string, fn func(i int, deadline int64, value []byte)) error {
	if s.shut.Load() {
		return s.errClosed
	}
	var small [16]int
	misses := small[:0]
	var tails []tailRead
	var tailBuf, join []byte
	s.ovMu.RLock()
	cur, frozen := s.cur, s.frozen
	if cur.m.len() == 0 && frozen == nil {
		for i := range keys {
			misses = append(misses, i)
		}
	} else {
		for i, k := range keys {
			e := cur.m.get(k)
			var f *entry
			if (e == nil || e.tail) && frozen != nil {
				f = frozen.m.get(k)
			}
			switch {
			case e == nil && f == nil:
				misses = append(misses, i)
			case e != nil && !e.tail:
				serveEntry(i, e, fn)
			case e == nil && !f.tail:
				serveEntry(i, f, fn)
			case f != nil && !f.tail:
				// A tail over the frozen overlay's put (never over
				// a deletion: see writer.baseLen).
				join = append(append(join[:0], f.value...), e.value...)
				fn(i, e.deadline, join[:len(join):len(join)])
			default:
				// Tails over the data file's value.
				t := tailRead{i: i}
				if f != nil {
					t.fgen, t.f = frozen.gen, appendSpan(&tailBuf, f.value)
					t.deadline = f.deadline
				}
				if e != nil {
					t.cgen, t.c = cur.gen, appendSpan(&tailBuf, e.value)
					t.deadline = e.deadline
				}
				tails = append(tails, t)
			}
		}
	}
	s.ovMu.RUnlock()
	// Read after the overlays: a checkpoint clears it before it drops one.
	if len(tails) == 0 && (len(misses) == 0 || s.dbEmpty.Load()) {
		return nil
	}
	// The overlays were read first: a record that was in neither is in
	// bbolt by now (a checkpoint drops an overlay only after its commit).
	var buf []byte
	err := s.view(func(tx *bolt.Tx) error {
		// One cursor for every key: Bucket.Get allocates one per call.
		// The keys bucket holds no nested buckets.
		c := tx.Bucket(bucketKeys).Cursor()
		read := func(k string) ([]byte, error) {
			buf = append(buf[:0], k...)
			found, v := c.Seek(buf)
			if v == nil || !bytes.Equal(found, buf) {
				return nil, nil
			}
			if len(v) < 8 {
				return nil, fmt.Errorf("persist: read %s: record %q is %d bytes, shorter than its deadline (the data file is corrupt)", s.opts.Path, k, len(v))
			}
			return v, nil
		}
		for _, i := range misses {
			v, err := read(keys[i])
			if err != nil {
				return err
			}
			if v != nil {
				fn(i, int64(binary.BigEndian.Uint64(v)), v[8:len(v):len(v)])
			}
		}
		if len(tails) == 0 {
			return nil
		}
		done := readCheckpointed(tx.Bucket(bucketMeta))
		for _, t := range tails {
			k := keys[t.i]
			v, err := read(k)
			if err != nil {
				return err
			}
			join = t.join(join[:0], k, v, tailBuf, done)
			switch {
			case join != nil:
				fn(t.i, t.deadline, join[:len(join):len(join)])
			case v != nil:
				fn(t.i, int64(binary.BigEndian.Uint64(v)), v[8:len(v):len(v)])
			}
		}
		return nil
	})
	return s.readError(err)
}

// serveEntry calls fn with e's record unless it is a deletion.
func serveEntry(i int, e *entry, fn func(i int, deadline int64, value []byte)) {
	if e.del {
		return
	}
	v := e.value
	if v == nil {
		v = emptyValue
	}
	fn(i, e.deadline, v[:len(v):len(v)])
}

// tailRead is a key of a Get whose value ends in tails over the data
// file's: the frozen overlay's, the current one's, or both (gen 0: none),
// copied at f and c into a buffer while Get held ovMu.
type tailRead struct {
	i          int
	deadline   int64 // the top tail's
	fgen, cgen uint64
	f, c       [2]int
}

func appendSpan(buf *[]byte, b []byte) [2]int {
	start := len(*buf)
	*buf = append(*buf, b...)
	return [2]int{start, len(*buf)}
}

// join appends to dst the value of key made of v, the data file's record
// (nil if none), and the tails that v does not hold yet, and returns it; nil
// if v holds them all, so that v is the key's value.
//
// Get reads the overlays, then the data file, which the checkpoint of the
// frozen overlay, or of the current one once frozen, may rewrite meanwhile:
// v may hold a tail already. ck, read in the same transaction as v, tells
// which overlays' records the data file holds for key.
func (t tailRead) join(dst []byte, key string, v []byte, tails []byte, ck checkpointed) []byte {
	top := t.cgen
	if top == 0 {
		top = t.fgen
	}
	if ck.holds(top, key) {
		return nil
	}
	if v != nil {
		dst = append(dst, v[8:]...)
	}
	if t.fgen != 0 && !ck.holds(t.fgen, key) {
		dst = append(dst, tails[t.f[0]:t.f[1]]...)
	}
	if t.cgen != 0 {
		dst = append(dst, tails[t.c[0]:t.c[1]]...)
	}
	if dst == nil {
		dst = emptyValue
	}
	return dst
}

// checkpointed is how far the checkpoints in a data file went: every
// overlay up to WAL generation gen, and the keys up to partial.key of the
// next one if a checkpoint of it was interrupted.
type checkpointed struct {
	gen     uint64
	partial partial
}

func readCheckpointed(meta *bolt.Bucket) checkpointed {
	var ck checkpointed
	if v := meta.Get(keyWAL); len(v) == 16 {
		ck.gen = binary.BigEndian.Uint64(v)
	}
	ck.partial = readPartial(meta)
	return ck
}

// holds reports whether the data file holds the final value of key in the
// overlay of WAL generation gen.
func (ck checkpointed) holds(gen uint64, key string) bool {
	return gen <= ck.gen || gen == ck.partial.gen && key <= ck.partial.key
}

// Scan calls fn, in key order, for the keys that start with prefix and sort
// after after ("" starts at the first key with the prefix), at most limit of
// them (limit <= 0: no bound), in one read transaction; fn returns false to
// stop. value is valid only during fn and must not be modified.
//
// Scan first waits for a checkpoint of everything committed before it was
// called (none if the overlay is empty), then reads the data file: it sees
// every record committed before the call, and maybe later ones, including
// expired ones not yet swept. It is meant for the admin API and for
// handing keys over, not for the decision path. The read transaction stays
// open while fn runs and, while it is open, the checkpointer cannot grow the
// file's memory mapping: fn should be quick and must never wait for a
// Commit, Flush or Close (that can deadlock).
func (s *Store) Scan(prefix, after string, limit int, fn func(key string, deadline int64, value []byte) bool) error {
	if err := s.checkpointNow(); err != nil {
		return err
	}
	start := prefix
	if after > prefix {
		start = after
	}
	p := []byte(prefix)
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketKeys).Cursor()
		k, v := c.Seek([]byte(start))
		if after != "" && string(k) == after {
			k, v = c.Next()
		}
		for n := 0; k != nil && bytes.HasPrefix(k, p) && (limit <= 0 || n < limit); n++ {
			if len(v) < 8 {
				return fmt.Errorf("persist: scan %s: record %q is %d bytes, shorter than its deadline (the data file is corrupt)", s.opts.Path, k, len(v))
			}
			if !fn(string(k), int64(binary.BigEndian.Uint64(v)), v[8:len(v):len(v)]) {
				return nil
			}
			k, v = c.Next()
		}
		return nil
	})
	return s.readError(err)
}

// inOverlay reports whether the overlays hold a record of key, newer than
// the data file's.
func (s *Store) inOverlay(key []byte) bool {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	if s.cur.m.getBytes(key) != nil {
		return true
	}
	return s.frozen != nil && s.frozen.m.getBytes(key) != nil
}

// checkpointNow waits until everything committed before the call is in the
// data file.
func (s *Store) checkpointNow() error {
	c := &Commit{kind: kindCheckpoint}
	s.enqueue(c)
	<-c.Done()
	return c.Err()
}

// readError maps the error of a read transaction: its callback's errors
// are complete already; bbolt's only own error there is a closed database.
func (s *Store) readError(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return s.errClosed
	}
	return err
}

// NextDeadline returns the earliest deadline of any stored record, in unix
// nanoseconds, or 0 when the store holds no record. It is an atomic load,
// updated after every commit (before its done callbacks run), checkpoint and
// Sweep, and at Open. Records that are queued but not committed do not
// count. It may be earlier than the earliest live deadline, when a record
// in the data file was rewritten since the last checkpoint with a later
// deadline: a Sweep at that time deletes nothing live and moves it on.
func (s *Store) NextDeadline() int64 { return s.next.Load() }

// DeadlineChanged returns a channel (capacity 1, sent to without blocking)
// that receives whenever NextDeadline became earlier than it was, or
// non-zero when it was 0. A change that makes it later (a Sweep, a
// deletion) does not signal. A receiver should reload NextDeadline after
// each receive; signals coalesce.
func (s *Store) DeadlineChanged() <-chan struct{} { return s.changed }

// setOverlayNext and setDBNext publish the earliest deadline of the
// overlays (from the writer) and of bbolt (from the checkpointer).
func (s *Store) setOverlayNext(n int64) {
	s.nextMu.Lock()
	s.ovNext = n
	s.publishNext()
}

func (s *Store) setDBNext(n int64) {
	s.nextMu.Lock()
	s.dbNext = n
	s.publishNext()
}

// publishNext runs with nextMu held and unlocks it.
func (s *Store) publishNext() {
	next := s.ovNext
	if s.dbNext != 0 && (next == 0 || s.dbNext < next) {
		next = s.dbNext
	}
	old := s.next.Swap(next)
	s.nextMu.Unlock()
	if next != 0 && (old == 0 || next < old) {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
}

// Submit queues recs for the next commit and returns at once, unless
// MaxQueue batches are already queued: then it blocks until the writer makes
// room (Close also waits for it, so a batch that got into Submit before Close
// is committed, not refused).
//
// A commit appends everything the writer took from the queue to the WAL as
// one frame (write(2), and fdatasync in ModeFsync) and applies it to the
// overlay that Get reads. done (may be nil) is called on the writer
// goroutine after the commit holding recs succeeded (err == nil) or failed;
// callbacks run in submission order, each after the previous one returned.
// done must not block and must not call Submit, Sweep, Flush, Scan or
// Close: the writer waits for it. The returned Commit reports the same
// outcome; its Done channel closes after done has returned.
//
// recs and every Value slice belong to the store until done is called: the
// caller must not modify them before (the store copies the values; it keeps
// the Key strings). Records of the same key are applied in order, within a
// batch and across batches: the last put or deletion submitted wins, and an
// append adds to the value the records before it left (after a deletion,
// its Value alone is stored). A batch is all or nothing: it is committed in
// a single WAL frame, which a crash leaves whole or ignores whole.
//
// If recs holds an invalid record (empty or too long key, Value not nil with
// Deadline <= 0, value too long, an append of an empty or nil Value),
// nothing of the batch is queued. After Close, and for an invalid batch,
// Submit calls done synchronously, before it returns, and returns a Commit
// that is already done with the error (matching ErrClosed after Close).
func (s *Store) Submit(recs []Record, done func(error)) *Commit {
	return s.SubmitAfter(nil, recs, done)
}

// SubmitAfter is Submit for a batch that builds on an earlier one, prev,
// that the caller submitted to this store before (nil: none): a batch
// whose records were computed from what prev's records hold, such as an
// append to the value prev wrote, or a put of a state that includes what
// prev recorded. If prev fails, this batch is not written either: it fails
// with prev's error (nothing of it was written), and so does, in turn,
// every batch submitted after it that builds on it. A caller that chains
// each of its batches to the one before thus knows that once one of them
// failed, nothing it submitted after that reaches the store, until it
// submits a batch that builds on none (or on one that succeeded). prev and
// this batch may share a commit (a WAL frame), and then succeed or fail
// together. Otherwise SubmitAfter is Submit, and costs no more.
func (s *Store) SubmitAfter(prev *Commit, recs []Record, done func(error)) *Commit {
	c := &Commit{recs: recs, done: done, after: prev}
	appends, conds, err := s.checkRecords(recs)
	if err != nil {
		c.finish(err)
		return c
	}
	c.appends, c.conds = appends, conds
	s.enqueue(c)
	return c
}

// checkRecords returns an error naming the first invalid record of recs,
// or the numbers of appends and of conditional appends among them (counted
// here, on the caller's goroutine, so that the writer looks for them only in
// batches that hold some).
func (s *Store) checkRecords(recs []Record) (appends, conds int, err error) {
	for i := range recs {
		r := &recs[i]
		switch {
		case r.Key == "":
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d has an empty key (nothing of the batch was written)", s.opts.Path, i)
		case len(r.Key) > MaxKeyLen:
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d: key of %d bytes is longer than %d (nothing of the batch was written)", s.opts.Path, i, len(r.Key), MaxKeyLen)
		case r.Append && len(r.Value) == 0:
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d (key %q) appends an empty value; an append needs at least one byte (nothing of the batch was written)", s.opts.Path, i, r.Key)
		case r.Value != nil && r.Deadline <= 0:
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d (key %q) has a value and deadline %d; a stored record needs a deadline > 0 (nothing of the batch was written)", s.opts.Path, i, r.Key, r.Deadline)
		case len(r.Value) > MaxValueLen:
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d (key %q): value of %d bytes is longer than %d (nothing of the batch was written)", s.opts.Path, i, r.Key, len(r.Value), MaxValueLen)
		case r.IfLive < 0 || r.IfLive != 0 && !r.Append:
			return 0, 0, fmt.Errorf("persist: submit to %s: record %d (key %q) has IfLive %d; only an append takes one, > 0 (nothing of the batch was written)", s.opts.Path, i, r.Key, r.IfLive)
		}
		if r.Append {
			appends++
		}
		if r.IfLive != 0 {
			conds++
		}
	}
	return appends, conds, nil
}

// enqueue hands c to the writer, or finishes it with ErrClosed.
func (s *Store) enqueue(c *Commit) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		c.finish(s.errClosed)
		return
	}
	s.queue <- c
	s.mu.RUnlock()
}

// Sweep queues a pass that deletes every record whose deadline is <= now
// (unix nanoseconds). Its first part runs on the writer, with whatever else
// is queued: it takes the expired records of the overlay from its deadline
// heap and commits their deletions through the WAL (so that a replay does
// not bring them back), at most 10000 per commit, continuing in the next
// ones (interleaved with submitted batches) until none is left. Its second
// part runs on the checkpointer: it walks the data file's deadline index
// from its start, deleting at most 10000 records per transaction; no record
// is decoded and no key outside the expired range is touched. A record is
// deleted only if its stored deadline has passed; the entry of one that
// lives on (entries are lower bounds, see doc.go) moves to its deadline.
//
// While the data file's part of a pass may still run, an append to a key
// that only the data file holds, with a deadline <= now, stores its bytes
// alone (the commit deletes the key first, through the WAL): the pass was
// queued before the append and may delete that record at any moment, and a
// replay after a crash must find what the store showed.
//
// The returned Commit is done when the pass is complete (or failed; or
// abandoned with ErrClosed by Close, which does not finish a long pass), so a
// sweeper can wait for it and then read NextDeadline. Sweeps queued while a
// pass runs join it.
func (s *Store) Sweep(now int64) *Commit {
	c := &Commit{kind: kindSweep, now: now}
	s.enqueue(c)
	return c
}

// Flush waits until everything submitted before the call is committed to
// the WAL (and fsynced in ModeFsync); it does not wait for a checkpoint. It
// returns an error if a commit or a checkpoint failed since the previous
// Flush returned (or since Open), even if it held only records submitted
// after this call began; ErrClosed after Close.
func (s *Store) Flush() error {
	c := &Commit{kind: kindFlush}
	s.enqueue(c)
	<-c.Done()
	return c.Err()
}

// Close stops accepting work (Submit, Sweep, Flush and Scan then fail with
// ErrClosed), commits everything already queued, abandons the rest of a
// Sweep pass, writes every committed record into the data file (a last
// checkpoint), syncs it to disk whatever the mode, removes the WAL files,
// records that the run closed cleanly (see LastStop), closes the file, and
// waits for the store's goroutines. If the last checkpoint fails, the WAL
// files stay and the next Open replays them. It returns the first error: a
// commit or checkpoint that failed since the last Flush, the last
// checkpoint, the sync, the record, or the close. After any of these but
// the close, the run is not recorded as clean. Close is idempotent; later
// calls return the same error.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.queue)
		<-s.writerDone

		err := s.w.closeErr
		s.shut.Store(true)
		if cerr := s.db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("persist: close %s: %v", s.opts.Path, cerr)
		}
		s.closeErr = err
		if err == nil {
			s.log.Info("closed data file") // an error is returned, not logged
		}
	})
	return s.closeErr
}

type commitKind uint8

const (
	kindBatch commitKind = iota
	kindFlush
	kindSweep
	kindCheckpoint // Scan: wait until the overlay is in bbolt
)

// Commit is the outcome of a Submit (or a Sweep): it is done once the
// commit holding the batch has succeeded or failed.
type Commit struct {
	// Set before the Commit is queued, read by the writer.
	recs    []Record
	appends int // appends among recs
	conds   int // conditional appends among them (Record.IfLive)
	done    func(error)
	kind    commitKind
	now     int64  // kindSweep
	gen     uint64 // kindCheckpoint: the WAL generation to checkpoint, set by the writer
	// after is the batch this one builds on (SubmitAfter), until this one
	// is done: dropped then, so that a chain of batches does not keep
	// every earlier one alive.
	after *Commit

	// Used by the writer goroutine only: the error of a batch that is not
	// written because the batch it builds on failed (or was not written).
	skip error
	// skipped are the indexes in recs of the conditional appends that were
	// left out, in increasing order: set by the writer before the commit
	// is finished, read by Skipped after.
	skipped []int

	mu       sync.Mutex
	ch       chan struct{} // made on the first Done call
	finished bool
	err      error
}

// closedChan is returned by Done for a Commit that finished before anyone
// asked for its channel.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// Done returns a channel that is closed once the commit is done: committed,
// failed, or refused.
func (c *Commit) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		if c.finished {
			return closedChan
		}
		c.ch = make(chan struct{})
	}
	return c.ch
}

// Err returns nil if the commit succeeded, or why it failed. It is valid
// once Done is closed; before, it returns nil.
func (c *Commit) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Skipped returns the indexes, among the records submitted, of the
// conditional appends (Record.IfLive) that were not written because their
// key held no live value, in increasing order. It is complete once Done is
// closed and Err is nil; the caller must not modify it.
func (c *Commit) Skipped() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.skipped
}

// Status reports whether the commit is done and, if it is, its error
// (nil: it succeeded), without waiting, and without making the channel
// that Done makes.
func (c *Commit) Status() (done bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.finished, c.err
}

// finish calls the done callback, then records err and closes the channel.
func (c *Commit) finish(err error) {
	if c.done != nil {
		c.done(err)
	}
	c.mu.Lock()
	c.err = err
	c.finished = true
	c.recs = nil
	c.after = nil
	ch := c.ch
	c.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
