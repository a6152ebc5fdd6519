package persist

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/sluice-io/sluice/scripts/testkit"
)

// sealedFile builds, in three sessions, a data file whose every write was
// acknowledged, and returns what it must hold: keys and the meta records
// of bucket "overrides". The first session's checkpoint takes several
// bbolt transactions (more than maxTxKeys keys), as the file did.
func sealedFile(t *testing.T, path string) (map[string]stored, map[string]string) {
	t.Helper()
	want := make(map[string]stored)
	wantMeta := make(map[string]string)
	session := func(n, every int, value string, meta bool) {
		s, err := Open(Options{Path: path, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var recs []Record
		for i := 0; i < n; i += every {
			key := fmt.Sprintf("key %06d", i)
			v := fmt.Sprintf("%s %d", value, i)
			recs = append(recs, put(key, int64(i+1), v))
			want[key] = stored{int64(i + 1), v}
		}
		submit(t, s, recs...)
		if meta {
			if err := s.PutMeta("overrides", "tenant-7", []byte(value)); err != nil {
				t.Fatal(err)
			}
			wantMeta["tenant-7"] = value
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	session(maxTxKeys+904, 1, "first", false)
	session(maxTxKeys+904, 3, "second", true)
	session(100, 7, "third", false)
	return want, wantMeta
}

// TestMetaPageDamageLosesNothing flips every 4-byte window of both bbolt
// meta pages of a data file, one window per copy, and opens each copy.
// The invariant: Open refuses the file (ErrFormat, the file unchanged), or
// every acknowledged record and meta record is there, with its latest
// value. Before seals, a damaged newest meta page made bbolt start on the
// older one without a word, and the last session's writes were gone.
func TestMetaPageDamageLosesNothing(t *testing.T) {
	dir := t.TempDir()
	orig := filepath.Join(dir, "orig.db")
	want, wantMeta := sealedFile(t, orig)
	good, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	path := filepath.Join(dir, "flipped.db")
	quiet := slog.New(slog.DiscardHandler)
	opened, refused := 0, 0
	for off := 0; off+4 <= 2*ps; off += 4 {
		// bbolt reads the first 80 bytes of a meta page (its header and
		// the meta record); with -short or -race, windows past them are
		// sampled.
		if (testing.Short() || raceEnabled) && off%ps >= 128 && off%256 != 0 {
			continue
		}
		b := bytes.Clone(good)
		for i := off; i < off+4; i++ {
			b[i] ^= 0xff
		}
		writeFile(t, path, b)
		s, err := Open(Options{Path: path, Logger: quiet})
		if err != nil {
			refused++
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("offset %d: Open = %v; want nil or ErrFormat", off, err)
			}
			if after, rerr := os.ReadFile(path); rerr != nil || !bytes.Equal(after, b) {
				t.Fatalf("offset %d: Open refused the file (%v) and modified it", off, err)
			}
			continue
		}
		opened++
		got := dump(t, s)
		if d := firstDiff(got, want); d != "none" {
			t.Errorf("offset %d: opened, but the records differ from the acknowledged ones: %s", off, d)
		}
		gotMeta := make(map[string]string)
		if err := s.ScanMeta("overrides", func(k string, v []byte) bool { gotMeta[k] = string(v); return true }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(gotMeta) != fmt.Sprint(wantMeta) {
			t.Errorf("offset %d: meta records %v; want %v", off, gotMeta, wantMeta)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("offset %d: Close = %v", off, err)
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d windows: %d opened with every acknowledged record, %d refused", opened+refused, opened, refused)
	if opened == 0 {
		t.Errorf("no damaged copy opened: a sealed file should survive a damaged meta page")
	}
}

// TestMetaPageDamageRepaired: a sealed file whose newest meta page is
// damaged opens on the other one, says so once in the log, naming the
// page, and the open rewrites the damaged page: the next open finds both
// valid.
func TestMetaPageDamageRepaired(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.db")
	want, _ := sealedFile(t, path)
	m := newestMeta(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := m*os.Getpagesize() + pageHeader + 16 // the root bucket's page
	for i := off; i < off+4; i++ {
		b[i] ^= 0xff
	}
	writeFile(t, path, b)
	var logs testkit.SyncBuffer
	s, err := Open(Options{Path: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Open(damaged newest meta page %d of a sealed file) = %v; want it opened", m, err)
	}
	if d := firstDiff(dump(t, s), want); d != "none" {
		t.Errorf("records differ from the acknowledged ones: %s", d)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantLog := fmt.Sprintf("bbolt meta page %d (bytes %d to %d) is damaged (checksum mismatch)", m, m*os.Getpagesize(), (m+1)*os.Getpagesize()-1)
	if n := strings.Count(logs.String(), wantLog); n != 1 {
		t.Errorf("log holds %q %d times; want once. Log:\n%s", wantLog, n, logs.String())
	}
	if d, err := checkPages(path); err != nil || d.page >= 0 {
		t.Errorf("after the open: meta damage %v, %v; want both pages valid", d, err)
	}
}

// TestMetaPageDamageUnsealedRefused: a file last written by a build that
// did not seal (no seal record) and whose newest meta page is damaged is
// refused with one error naming the page; the file is not modified.
func TestMetaPageDamageUnsealedRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.db")
	sealedFile(t, path)
	// What a build without seals leaves: remove the record, and write a
	// transaction after it that nothing seals.
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keySeal) })
	rawUpdate(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketKeys).Put([]byte("late"), make([]byte, 9)) })
	m := newestMeta(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := m*os.Getpagesize() + pageHeader + 48 // the transaction ID
	for i := off; i < off+4; i++ {
		b[i] ^= 0xff
	}
	writeFile(t, path, b)
	_, err = Open(Options{Path: path, Logger: testLogger(t)})
	want := fmt.Sprintf("bbolt meta page %d (bytes %d to %d) is damaged (checksum mismatch)", m, m*os.Getpagesize(), (m+1)*os.Getpagesize()-1)
	if !errors.Is(err, ErrFormat) || !strings.Contains(fmt.Sprint(err), want) {
		t.Fatalf("Open = %v; want ErrFormat saying %q", err, want)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
		t.Errorf("Open refused the file and modified it")
	}
}

// newestMeta returns which meta page (0 or 1) of the file holds the newest
// transaction.
func newestMeta(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	m0, bad0 := parseMeta(b[pageHeader:])
	m1, bad1 := parseMeta(b[ps+pageHeader:])
	if bad0 != "" || bad1 != "" {
		t.Fatalf("meta pages: %q, %q; want both valid", bad0, bad1)
	}
	if m1.txid > m0.txid {
		return 1
	}
	return 0
}
