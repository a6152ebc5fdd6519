package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestVerifyListsEveryDamage: Verify lists a damaged meta page, a damaged
// page of the keys tree and each record the check refuses, goes on past
// each, and changes nothing in the file.
func TestVerifyListsEveryDamage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.db")
	s, err := Open(Options{Path: path, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	for i := range 3000 {
		recs = append(recs, put(fmt.Sprintf("key %05d", i), int64(i+1), "good"))
	}
	submit(t, s, recs...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(_ string, v []byte) error {
		if string(v) != "good" {
			return errors.New("not good")
		}
		return nil
	}
	rep, err := Verify(path, check)
	if err != nil || !rep.OK() || rep.Records != 3000 {
		t.Fatalf("Verify(clean file) = %+v, %v; want 3000 records, nothing damaged", rep, err)
	}

	rawUpdate(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		for _, k := range []string{"key 00007", "key 02999"} {
			if err := b.Put([]byte(k), append(make([]byte, 8), "bad"...)); err != nil {
				return err
			}
		}
		return nil
	})
	older := 1 - newestMeta(t, path) // the newest holds the bad records
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	// The older meta page's checksum, and the ID in the header of a leaf
	// page that holds keys.
	b[older*ps+pageHeader+56] ^= 0xff
	leaf := -1
	for p := 2; p*ps+pageHeader <= len(b); p++ {
		h := b[p*ps:]
		if binary.LittleEndian.Uint64(h) == uint64(p) && binary.LittleEndian.Uint16(h[8:]) == pageLeaf && bytes.Contains(h[:ps], []byte("key 015")) {
			leaf = p
			break
		}
	}
	if leaf < 0 {
		t.Fatal("no leaf page holds key 015..")
	}
	b[leaf*ps] ^= 0xff
	writeFile(t, path, b)

	rep, err = Verify(path, check)
	if err != nil {
		t.Fatalf("Verify(damaged file) = %v", err)
	}
	got := fmt.Sprintf("%+v", rep)
	for _, want := range []string{
		fmt.Sprintf("bbolt meta page %d (bytes %d to %d) is damaged (checksum mismatch)", older, older*ps, (older+1)*ps-1),
		fmt.Sprintf("page %d says it is page %d", leaf, leaf^0xff),
		"{Key:key 00007 Reason:not good}",
		"{Key:key 02999 Reason:not good}",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Verify(damaged file) = %s\nwant it to list %q", got, want)
		}
	}
	if rep.OK() || len(rep.Damaged) != 2 {
		t.Errorf("Verify(damaged file): %d damaged records; want 2", len(rep.Damaged))
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
		t.Errorf("Verify modified the file")
	}
}
