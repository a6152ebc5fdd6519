package control

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// The Raft log and stable store live in one bbolt file, raft.db, beside
// the node's data file (its own file, so that --durability memory keeps
// them on disk too: a voter that forgets its vote can help elect two
// leaders). Its format:
//
//   - bucket "meta": "format" → "1"; "id" → this node's Raft server ID, a
//     UUID drawn when the file is created (a lost data directory comes
//     back under a new ID); "bootstrap" → the node's bootstrap set while
//     it has none of Raft's state: lines "ID name", sorted (see
//     bootstrap.go). It only grows.
//   - bucket "logs": 8-byte big-endian index → an entry: byte 1 (the
//     entry's encoding version), index and term (uvarint each), type (one
//     byte), the time it was appended (Unix nanoseconds, varint), the data
//     and the extensions (a uvarint length then the bytes, each).
//   - bucket "stable": Raft's current term and vote, by Raft's key names.
//
// Every write is a bbolt transaction synced before it returns. A file with
// an unknown format, or an entry that does not decode, stops the node with
// an error naming it; it is never wiped.

const storeFormat = "1"

var (
	bucketMeta   = []byte("meta")
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
)

// errNotFound is the error Raft expects, by its text, for a missing
// stable key.
var errNotFound = errors.New("not found")

// store is the Raft log and stable store in a bbolt file.
type store struct {
	db *bolt.DB
	id string
}

// openStore opens (or creates) the Raft store at path.
func openStore(path string) (*store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("control: open %s: %w", path, err)
	}
	s := &store{db: db}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		switch f := meta.Get([]byte("format")); {
		case f == nil:
			if meta.Stats().KeyN > 0 || tx.Bucket(bucketLogs) != nil {
				return fmt.Errorf("no format version in a file that holds data")
			}
			if err := meta.Put([]byte("format"), []byte(storeFormat)); err != nil {
				return err
			}
			if err := meta.Put([]byte("id"), []byte(newUUID())); err != nil {
				return err
			}
		case string(f) != storeFormat:
			return fmt.Errorf("format version %q; this build reads %q", f, storeFormat)
		}
		s.id = string(meta.Get([]byte("id")))
		if s.id == "" {
			return fmt.Errorf("no server ID")
		}
		if _, err := tx.CreateBucketIfNotExists(bucketLogs); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketStable)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("control: %s: %w", path, err)
	}
	return s, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func (s *store) Close() error { return s.db.Close() }

func indexKey(i uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], i)
	return k[:]
}

// FirstIndex implements raft.LogStore.
func (s *store) FirstIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().First(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// LastIndex implements raft.LogStore.
func (s *store) LastIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().Last(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// GetLog implements raft.LogStore.
func (s *store) GetLog(index uint64, l *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(indexKey(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		if err := decodeLog(v, l); err != nil {
			return fmt.Errorf("control: raft.db: entry %d: %w", index, err)
		}
		return nil
	})
}

// StoreLog implements raft.LogStore.
func (s *store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore.
func (s *store) StoreLogs(logs []*raft.Log) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		for _, l := range logs {
			if err := b.Put(indexKey(l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange implements raft.LogStore.
func (s *store) DeleteRange(lo, hi uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLogs).Cursor()
		for k, _ := c.Seek(indexKey(lo)); k != nil && binary.BigEndian.Uint64(k) <= hi; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set implements raft.StableStore.
func (s *store) Set(key, val []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketStable).Put(key, val) })
}

// Get implements raft.StableStore.
func (s *store) Get(key []byte) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketStable).Get(key)
		if v == nil {
			return errNotFound
		}
		out = append([]byte(nil), v...)
		return nil
	})
	return out, err
}

// SetUint64 implements raft.StableStore.
func (s *store) SetUint64(key []byte, val uint64) error { return s.Set(key, indexKey(val)) }

// GetUint64 implements raft.StableStore.
func (s *store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("control: raft.db: stable key %q holds %d bytes; want 8", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 32+len(l.Data)+len(l.Extensions))
	b = append(b, 1)
	b = binary.AppendUvarint(b, l.Index)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	return append(b, l.Extensions...)
}

var errShortEntry = errors.New("entry cut short")

func decodeLog(b []byte, l *raft.Log) error {
	if len(b) == 0 || b[0] != 1 {
		return fmt.Errorf("unknown entry encoding")
	}
	b = b[1:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errShortEntry
		}
		b = b[n:]
		return v, nil
	}
	bytesField := func() ([]byte, error) {
		n, err := uv()
		if err != nil {
			return nil, err
		}
		if uint64(len(b)) < n {
			return nil, errShortEntry
		}
		out := append([]byte(nil), b[:n]...)
		b = b[n:]
		return out, nil
	}
	var err error
	if l.Index, err = uv(); err != nil {
		return err
	}
	if l.Term, err = uv(); err != nil {
		return err
	}
	if len(b) == 0 {
		return errShortEntry
	}
	l.Type = raft.LogType(b[0])
	b = b[1:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return errShortEntry
	}
	b = b[n:]
	l.AppendedAt = time.Time{}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	if l.Data, err = bytesField(); err != nil {
		return err
	}
	if len(l.Data) == 0 {
		l.Data = nil
	}
	if l.Extensions, err = bytesField(); err != nil {
		return err
	}
	if len(l.Extensions) == 0 {
		l.Extensions = nil
	}
	if len(b) != 0 {
		return fmt.Errorf("%d bytes after the entry", len(b))
	}
	return nil
}

// loadBootSet returns the bootstrap set saved by saveBootSet: ID → name.
func (s *store) loadBootSet() (map[string]string, error) {
	out := make(map[string]string)
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get([]byte("bootstrap"))
		for _, line := range strings.Split(string(v), "\n") {
			if line == "" {
				continue
			}
			id, name, ok := strings.Cut(line, " ")
			if !ok || id == "" || name == "" {
				return fmt.Errorf("control: raft.db: bootstrap set: bad line %q", line)
			}
			out[id] = name
		}
		return nil
	})
	return out, err
}

// saveBootSet saves the bootstrap set, synced before it returns.
func (s *store) saveBootSet(set map[string]string) error {
	ids := slices.Sorted(maps.Keys(set))
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s %s\n", id, set[id])
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put([]byte("bootstrap"), []byte(b.String()))
	})
}

// NodeID returns the Raft server ID of the node whose data directory is
// dir, drawing it (and creating raft.db) on first use.
func NodeID(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("control: %w", err)
	}
	s, err := openStore(filepath.Join(dir, "raft.db"))
	if err != nil {
		return "", err
	}
	id := s.id
	return id, s.Close()
}
