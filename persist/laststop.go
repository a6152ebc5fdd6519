package persist

import (
	"errors"
	"fmt"
	"os"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// The run record says how the process that last had the data file open
// stopped. In ModeCommit and ModeAsync an acknowledged write survives a
// kill -9 (the kernel's page cache holds it) but not a power loss or a
// kernel crash. A store cannot see which one ended the last run, but the
// kernel's boot id tells: it changes at every boot.
//
// Open reads the record, then writes a new one: this machine's boot id,
// the store's Mode, not closed. Close writes it again, closed, once the
// last checkpoint is synced. So at the next Open a record that says
// closed is a clean stop; one that says not closed, with the same boot
// id, is a process that died while the machine ran on; one with another
// boot id, or none, may be a power loss.
//
// The record lives in the data file's meta bucket, under keyRun, not in a
// file of its own: it describes the data file, so it moves, is copied and
// is backed up with it, and a data file moved aside leaves no stale record
// behind; Open writes and seals the file anyway; and it needs none of a
// new file's rename and directory syncs. It costs Open and Close a small
// transaction, its seal and a sync each; commits never touch it.

// keyRun, in the meta bucket, holds the run record:
//
//	byte 1 if the run closed cleanly, 0 if not | byte Mode | boot id
//
// The boot id is empty when it was unknown.
var keyRun = []byte("run")

// bootIDFile holds the Linux kernel's boot id, a random UUID drawn at each
// boot. Other systems have no such file: there the boot id is unknown.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// readBootID is the default Options.BootID.
func readBootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// LastStop says how the process that last had the data file open
// stopped, as Open found it.
type LastStop uint8

const (
	// StopFresh: the data file holds no record of an earlier run. It is
	// new, or it was last written by a build that did not keep the record.
	StopFresh LastStop = iota
	// StopClean: the last run's Close completed. Everything it
	// acknowledged was in the data file, synced.
	StopClean
	// StopCrash: the last run did not close (kill -9, an OOM kill, a
	// panic), and the machine has not booted since. The kernel kept what
	// the run had written.
	StopCrash
	// StopReboot: the last run did not close, and the machine has booted
	// since, or the boot id was unknown then or now. A power loss or a
	// kernel crash may have ended it.
	StopReboot

	numStops
)

// stopNames is indexed by LastStop.
var stopNames = [numStops]string{StopFresh: "fresh", StopClean: "clean", StopCrash: "crash", StopReboot: "reboot"}

// String returns the stop's name: "fresh", "clean", "crash" or "reboot".
func (l LastStop) String() string {
	if l < numStops {
		return stopNames[l]
	}
	return fmt.Sprintf("laststop(%d)", uint8(l))
}

// MayHaveLost reports whether writes acknowledged by a run in mode prev
// may be missing after a stop like l. Across a reboot they may in
// ModeCommit and ModeAsync, which do not fsync a write before it is
// acknowledged. After a crash they may in ModeAsync only: its engine
// acknowledges a write before it is committed. A clean or fresh stop
// loses nothing. The mode that counts is the one the last run used, not
// the store's now.
func (l LastStop) MayHaveLost(prev Mode) bool {
	switch l {
	case StopReboot:
		return prev != ModeFsync
	case StopCrash:
		return prev == ModeAsync
	}
	return false
}

// runRecord is the value of keyRun.
type runRecord struct {
	clean  bool
	mode   Mode
	bootID string
}

func (r runRecord) encode() []byte {
	b := make([]byte, 2, 2+len(r.bootID))
	if r.clean {
		b[0] = 1
	}
	b[1] = byte(r.mode)
	return append(b, r.bootID...)
}

// readRun returns the run record of the data file; found is false if it
// has none. A record this build cannot read is ErrFormat: it was written
// by a later build, or damaged.
func readRun(db *bolt.DB, path string) (r runRecord, found bool, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(keyRun)
		if v == nil {
			return nil
		}
		if len(v) < 2 || v[0] > 1 || Mode(v[1]) >= numModes {
			return formatError(path, "run record %x in the %q bucket; want a clean byte (0 or 1), a mode (0 to %d) and a boot id", v, bucketMeta, numModes-1)
		}
		r = runRecord{clean: v[0] == 1, mode: Mode(v[1]), bootID: string(v[2:])}
		found = true
		return nil
	})
	return r, found, err
}

// lastStop tells how the run that wrote prev stopped, seen from a machine
// whose boot id is bootID ("" if unknown).
func lastStop(prev runRecord, found bool, bootID string) LastStop {
	switch {
	case !found:
		return StopFresh
	case prev.clean:
		return StopClean
	case bootID != "" && prev.bootID == bootID:
		return StopCrash
	}
	return StopReboot
}

// writeRun writes r into the data file and makes it durable, followed by
// a seal (see seal.go), whatever the mode.
func writeRun(db *bolt.DB, r runRecord) error {
	err := db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("no %q bucket", bucketMeta)
		}
		return meta.Put(keyRun, r.encode())
	})
	if err == nil {
		err = seal(db)
	}
	if err == nil && db.NoSync {
		err = db.Sync()
	}
	return err
}

// bootID returns this machine's boot id from o.BootID, "" if unknown, and
// why it is unknown.
func bootID(o Options) (string, error) {
	id, err := o.BootID()
	id = strings.TrimSpace(id)
	if err == nil && id == "" {
		err = errors.New("empty boot id")
	}
	if err != nil {
		return "", err
	}
	return id, nil
}

// LastStop returns how the process that last had the data file open
// stopped, as Open found it.
func (s *Store) LastStop() LastStop { return s.lastStop }

// LastMode returns the Mode of the process that last had the data file
// open; ok is false if its stop is StopFresh (no record of it).
func (s *Store) LastMode() (m Mode, ok bool) {
	return s.lastMode, s.lastStop != StopFresh
}

// MayHaveLost reports whether writes the last process acknowledged may be
// missing from the store: LastStop().MayHaveLost of the last run's mode.
func (s *Store) MayHaveLost() bool {
	return s.lastStop.MayHaveLost(s.lastMode)
}
