package persist

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// bootIs returns an Options.BootID that says id.
func bootIs(id string) func() (string, error) {
	return func() (string, error) { return id, nil }
}

// bootUnknown is an Options.BootID that cannot read the boot id.
func bootUnknown() (string, error) { return "", errors.New("no boot id here") }

// run is one process's use of a data file: the boot id it sees, its mode,
// and how it stops.
type run struct {
	boot  func() (string, error)
	mode  Mode
	crash bool // stop as kill -9 would, instead of Close
}

// runs opens and stops a store on path once per run, in order, each
// writing a record so that a replay has something to do.
func runs(t *testing.T, path string, rs ...run) {
	t.Helper()
	for i, r := range rs {
		s, err := Open(Options{Path: path, Mode: r.mode, BootID: r.boot, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("run %d: Open = %v", i, err)
		}
		submit(t, s, put("k", 1, "v"))
		if r.crash {
			crash(t, s)
		} else if err := s.Close(); err != nil {
			t.Fatalf("run %d: Close = %v", i, err)
		}
	}
}

// TestLastStop: Open tells how the last process stopped from the record
// the runs before left: a Close that completed is clean whatever the boot
// id; a run that did not close is a crash when the boot id is the same,
// and a possible power loss when it changed or is unknown, then or now.
// Each run writes its own record: a clean Close before a crash does not
// make the crash clean.
func TestLastStop(t *testing.T) {
	a, b := bootIs("boot-a\n"), bootIs("boot-b")
	tests := []struct {
		name   string
		before []run
		boot   func() (string, error)
		want   LastStop
	}{
		{"new file", nil, a, StopFresh},
		{"closed", []run{{boot: a}}, a, StopClean},
		{"closed, then a reboot", []run{{boot: a}}, b, StopClean},
		{"closed, boot id unknown", []run{{boot: bootUnknown}}, bootUnknown, StopClean},
		{"crash", []run{{boot: a, crash: true}}, a, StopCrash},
		{"closed, then a crash", []run{{boot: a}, {boot: a, crash: true}}, a, StopCrash},
		{"crash, then a reboot", []run{{boot: a, crash: true}}, b, StopReboot},
		{"crash, boot id unknown now", []run{{boot: a, crash: true}}, bootUnknown, StopReboot},
		{"crash, boot id unknown then", []run{{boot: bootUnknown, crash: true}}, a, StopReboot},
		{"crash, boot id unknown then and now", []run{{boot: bootUnknown, crash: true}}, bootUnknown, StopReboot},
		{"crash, empty boot id", []run{{boot: bootIs(" \n"), crash: true}}, bootIs(""), StopReboot},
		{"crash, then a clean run", []run{{boot: a, crash: true}, {boot: b}}, b, StopClean},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOptions(t)
			runs(t, o.Path, tt.before...)
			o.BootID = tt.boot
			s := openStore(t, o)
			if got := s.LastStop(); got != tt.want {
				t.Errorf("LastStop() after %+v = %v; want %v", tt.before, got, tt.want)
			}
			if _, ok := s.LastMode(); ok != (tt.want != StopFresh) {
				t.Errorf("LastMode() ok = %v; want %v", ok, tt.want != StopFresh)
			}
		})
	}
}

// TestMayHaveLost: acknowledged writes may be missing after a possible
// power loss if the last run did not fsync them (ModeCommit, ModeAsync),
// and after a crash if its engine acknowledged them before their commit
// (ModeAsync); never after a clean stop. The last run's mode decides, not
// the store's now (each case opens in another mode than the run before).
func TestMayHaveLost(t *testing.T) {
	a, b := bootIs("boot-a"), bootIs("boot-b")
	other := func(m Mode) Mode { return (m + 1) % numModes }
	tests := []struct {
		last  Mode
		crash bool
		boot  func() (string, error)
		want  bool
	}{
		{ModeCommit, true, b, true},
		{ModeAsync, true, b, true},
		{ModeFsync, true, b, false},
		{ModeCommit, true, bootUnknown, true},
		{ModeFsync, true, bootUnknown, false},
		{ModeCommit, true, a, false},
		{ModeFsync, true, a, false},
		{ModeAsync, true, a, true},
		{ModeCommit, false, b, false},
		{ModeAsync, false, b, false},
	}
	for _, tt := range tests {
		o := testOptions(t)
		runs(t, o.Path, run{boot: a, mode: tt.last, crash: tt.crash})
		o.BootID, o.Mode = tt.boot, other(tt.last)
		s, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		boot, _ := tt.boot()
		if got := s.MayHaveLost(); got != tt.want {
			t.Errorf("run in mode %v, crash %v, reopened in mode %v on boot %q (%v): MayHaveLost() = %v; want %v",
				tt.last, tt.crash, o.Mode, boot, s.LastStop(), got, tt.want)
		}
		if m, ok := s.LastMode(); m != tt.last || !ok {
			t.Errorf("run in mode %v: LastMode() = %v, %v; want %v, true", tt.last, m, ok, tt.last)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// Every stop and mode, against the rule as the docs state it.
	for l := StopFresh; l < numStops; l++ {
		for m := ModeCommit; m < numModes; m++ {
			want := l == StopReboot && m != ModeFsync || l == StopCrash && m == ModeAsync
			if got := l.MayHaveLost(m); got != want {
				t.Errorf("%v.MayHaveLost(%v) = %v; want %v", l, m, got, want)
			}
		}
	}
}

// TestLastStopOlderFile: a data file last written by a build without the
// run record reads as fresh, even after a crash, and its records are
// replayed as ever.
func TestLastStopOlderFile(t *testing.T) {
	o := testOptions(t)
	o.BootID = bootIs("boot-a")
	runs(t, o.Path, run{boot: o.BootID, crash: true})
	rawUpdate(t, o.Path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyRun) })
	s := openStore(t, o)
	if got := s.LastStop(); got != StopFresh {
		t.Errorf("LastStop() of a file without a run record = %v; want %v", got, StopFresh)
	}
	if got := getAll(t, s, "k"); got["k"] != (stored{1, "v"}) {
		t.Errorf("records = %v; want k replayed", got)
	}
}

// TestFailedCloseNotClean: a Close that reports a failed commit does not
// record a clean close: the next Open takes the run as a crash.
func TestFailedCloseNotClean(t *testing.T) {
	o := testOptions(t)
	o.BootID = bootIs("boot-a")
	var fail atomic.Bool
	o.WriteFault = func() error {
		if fail.Load() {
			return errors.New("injected failure")
		}
		return nil
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	if err := wait(t, s.Submit([]Record{put("lost", 1, "v")}, nil)); err == nil {
		t.Fatal("commit with a write fault = nil; want the failure")
	}
	if err := s.Close(); err == nil {
		t.Fatal("Close() after an unreported failure = nil; want it")
	}
	o.WriteFault = nil
	s = openStore(t, o)
	if got := s.LastStop(); got != StopCrash {
		t.Errorf("LastStop() after a Close that failed = %v; want %v", got, StopCrash)
	}
}

// TestRunRecordRefused: Open refuses a run record it cannot read, with
// ErrFormat, and leaves the file as it was.
func TestRunRecordRefused(t *testing.T) {
	for _, v := range [][]byte{{}, {1}, {2, 0}, {0, byte(numModes)}} {
		o := testOptions(t)
		runs(t, o.Path, run{boot: bootIs("boot-a")})
		rawUpdate(t, o.Path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyRun, v) })
		before, err := os.ReadFile(o.Path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Open(o)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "run record") {
			t.Errorf("Open(run record %x) = %v; want ErrFormat naming the run record", v, err)
		}
		if after, _ := os.ReadFile(o.Path); !bytes.Equal(before, after) {
			t.Errorf("Open(run record %x) changed the file", v)
		}
		if m, _ := filepath.Glob(o.Path + ".wal.*"); len(m) != 0 {
			t.Errorf("Open(run record %x) left WAL files %v", v, m)
		}
	}
}
