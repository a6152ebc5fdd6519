package persist

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Meta buckets hold small, rarely written data that is not key state: the
// admin API's overrides today, more later. Each named bucket NAME is the
// top-level bbolt bucket "meta:NAME", created on its first write, so it can
// never collide with the store's own buckets ("meta", "keys", "expiry").
// Files written before meta buckets existed simply have none; the format
// version does not change.
//
//	meta:overrides   one record per override (see package api)
//
// Unlike key state, meta records bypass the group-commit writer: each
// PutMeta or DeleteMeta is its own bbolt transaction, synced to the disk
// before it returns, whatever the store's Mode. They are meant for writes
// made by people, a few per minute at most.

// metaPrefix starts the bbolt name of every meta bucket.
const metaPrefix = "meta:"

// Limits of a meta record, from bbolt's limits.
const (
	// MaxMetaKeyLen is the longest key of a meta record, in bytes.
	MaxMetaKeyLen = bolt.MaxKeySize
	// MaxMetaValueLen is the longest value of a meta record, in bytes.
	MaxMetaValueLen = bolt.MaxValueSize
)

// PutMeta stores value under key in the meta bucket named bucket, replacing
// what was there. It returns once the record is committed and synced to the
// disk. The store keeps no reference to value.
func (s *Store) PutMeta(bucket, key string, value []byte) error {
	if err := s.checkMeta("put", bucket, key); err != nil {
		return err
	}
	if len(value) > MaxMetaValueLen {
		return fmt.Errorf("persist: put %s meta %q: value of %d bytes is longer than %d", s.opts.Path, bucket, len(value), MaxMetaValueLen)
	}
	if value == nil {
		value = []byte{}
	}
	return s.updateMeta("put", bucket, func(tx *bolt.Tx) (bool, error) {
		b, err := tx.CreateBucketIfNotExists([]byte(metaPrefix + bucket))
		if err != nil {
			return false, err
		}
		return true, b.Put([]byte(key), value)
	})
}

// DeleteMeta removes key from the meta bucket named bucket and reports
// whether it was there. A deletion returns once it is committed and synced
// to the disk.
func (s *Store) DeleteMeta(bucket, key string) (existed bool, err error) {
	if err := s.checkMeta("delete", bucket, key); err != nil {
		return false, err
	}
	err = s.updateMeta("delete", bucket, func(tx *bolt.Tx) (bool, error) {
		b := tx.Bucket([]byte(metaPrefix + bucket))
		if b == nil || b.Get([]byte(key)) == nil {
			return false, nil
		}
		existed = true
		return true, b.Delete([]byte(key))
	})
	return existed, err
}

// ScanMeta calls fn for every record of the meta bucket named bucket, in
// ascending byte order of key, in one read transaction, until fn returns
// false. value is valid only during fn and must not be modified. A bucket
// never written to holds no record. fn must not call the store's write
// methods (PutMeta, DeleteMeta, Flush, Close): that can deadlock.
func (s *Store) ScanMeta(bucket string, fn func(key string, value []byte) bool) error {
	if bucket == "" {
		return fmt.Errorf("persist: scan %s meta: empty bucket name", s.opts.Path)
	}
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(metaPrefix + bucket))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if !fn(string(k), v) {
				return nil
			}
		}
		return nil
	})
	return s.readError(err)
}

func (s *Store) checkMeta(op, bucket, key string) error {
	switch {
	case bucket == "":
		return fmt.Errorf("persist: %s %s meta: empty bucket name", op, s.opts.Path)
	case key == "":
		return fmt.Errorf("persist: %s %s meta %q: empty key", op, s.opts.Path, bucket)
	case len(key) > MaxMetaKeyLen:
		return fmt.Errorf("persist: %s %s meta %q: key of %d bytes is longer than %d", op, s.opts.Path, bucket, len(key), MaxMetaKeyLen)
	}
	return nil
}

// updateMeta runs fn in its own read-write transaction and, if fn changed
// something, syncs the file. It holds the store's lock for reading so that
// Close, which syncs and closes the file, waits for it, and refuses to run
// once Close has begun.
func (s *Store) updateMeta(op, bucket string, fn func(*bolt.Tx) (changed bool, err error)) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return s.errClosed
	}
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	changed := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		changed, err = fn(tx)
		return err
	})
	if err == nil && changed {
		err = seal(s.db) // see seal.go
	}
	if err == nil && changed && s.db.NoSync {
		// In ModeCommit and ModeAsync the commit was write(2) only; a meta
		// record is rare and written by a person, so make it durable now.
		err = s.db.Sync()
	}
	switch {
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return s.errClosed
	case err != nil:
		return fmt.Errorf("persist: %s %s meta %q: %v", op, s.opts.Path, bucket, err)
	}
	return nil
}
