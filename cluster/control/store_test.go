package control

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// TestStoreRoundTrip: entries and stable keys survive a reopen, the
// server ID is drawn once, and DeleteRange removes exactly its range.
func TestStoreRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	s, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	id := s.id
	at := time.Unix(0, 1700000000123456789)
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte("conf"), AppendedAt: at},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte(`{"op":"init"}`), Extensions: []byte{1, 2}},
		{Index: 3, Term: 2, Type: raft.LogBarrier},
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 2); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = openStore(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.id != id {
		t.Fatalf("server ID after reopen %q; want %q", s.id, id)
	}
	for _, want := range logs {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", want.Index, err)
		}
		if !reflect.DeepEqual(&got, want) {
			t.Fatalf("GetLog(%d) = %+v; want %+v", want.Index, got, *want)
		}
	}
	if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term != 2 {
		t.Fatalf("GetUint64(CurrentTerm) = %d, %v; want 2", term, err)
	}
	if _, err := s.Get([]byte("LastVoteCand")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key: %v; want raft's \"not found\"", err)
	}
	if err := s.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 3 || last != 3 {
		t.Fatalf("after DeleteRange(1, 2): first %d, last %d; want 3, 3", first, last)
	}
	var l raft.Log
	if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(1) after its deletion: %v; want ErrLogNotFound", err)
	}
}

// TestStoreRefusesDamage: a file of an unknown format, or an entry that
// does not decode, is an error naming it; nothing is wiped.
func TestStoreRefusesDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	s, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	s.StoreLog(&raft.Log{Index: 7, Term: 1, Data: []byte("x")})
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketLogs).Put(indexKey(8), []byte{1, 8}) })
	var l raft.Log
	if err := s.GetLog(8, &l); err == nil || !strings.Contains(err.Error(), "entry 8") {
		t.Fatalf("GetLog of a damaged entry: %v; want an error naming entry 8", err)
	}
	s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put([]byte("format"), []byte("9")) })
	s.Close()
	if _, err := openStore(path); err == nil || !strings.Contains(err.Error(), `format version "9"`) {
		t.Fatalf("open a file of format 9: %v; want an error naming the format", err)
	}
}

// FuzzDecodeLog: no input panics the entry decoder, and what decodes
// encodes back to itself.
func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(&raft.Log{Index: 3, Term: 2, Type: raft.LogCommand, Data: []byte("d"), Extensions: []byte("e")}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if decodeLog(b, &l) != nil {
			return
		}
		var again raft.Log
		if err := decodeLog(encodeLog(&l), &again); err != nil || !reflect.DeepEqual(l, again) {
			t.Fatalf("round trip of %+v: %+v, %v", l, again, err)
		}
	})
}
