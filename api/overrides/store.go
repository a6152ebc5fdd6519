package overrides

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/cluster"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// Overrides are kept in the data file's meta bucket "overrides" (bbolt
// bucket "meta:overrides", see persist.Store.PutMeta), one record per
// override:
//
//	key:   "=" + override key for an exact-key override,
//	       "*" + override key for a prefix override
//	       (so the two overrides of one key are distinct records, and the
//	       empty prefix override, which matches every key, has a key too)
//	value: the sluicepb.Override message, proto-encoded, set_at filled in
//
// Every SetOverride and DeleteOverride writes (or deletes) its record and
// syncs the file before it answers, whatever the durability mode, and only
// then changes the table that checks read; overrides expired by then are
// deleted in the same call. At start the node loads every record; one it
// cannot decode stops the node with an error naming it (never a silent
// drop). Expired overrides are never applied nor listed.
//
// With durability "memory" there is no data file: overrides live in memory
// only, and a restart forgets them, like every key's state.

// bucket is the meta bucket that holds the overrides.
const bucket = "overrides"

// Markers that start an override's record key.
const (
	exactMarker  = '='
	prefixMarker = '*'
)

// RecordKey is the record key of the override with key and prefix flag.
// ListOverrides page tokens are this, base64url-encoded.
func RecordKey(key string, prefix bool) string {
	if prefix {
		return string(prefixMarker) + key
	}
	return string(exactMarker) + key
}

// ParseRecordKey is the inverse of RecordKey.
func ParseRecordKey(rk string) (key string, prefix, ok bool) {
	if rk == "" {
		return "", false, false
	}
	switch rk[0] {
	case exactMarker:
		return rk[1:], false, true
	case prefixMarker:
		return rk[1:], true, true
	}
	return "", false, false
}

// load reads the overrides stored in st, expired ones included: Match
// never applies them and listings skip them, and the next Set or Delete
// deletes them from the file.
func load(st *persist.Store) ([]*Override, error) {
	var list []*Override
	var bad error
	err := st.ScanMeta(bucket, func(rk string, value []byte) bool {
		o, err := decode(rk, value)
		if err != nil {
			bad = fmt.Errorf("api: load overrides from %s: record %q: %v (the file was not modified; delete the record with bbolt tools or restore a backup)", st.Path(), rk, err)
			return false
		}
		list = append(list, o)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("api: load overrides: %w", err)
	}
	return list, bad
}

// encode returns the record value of o.
func encode(o *Override) ([]byte, error) {
	b, err := proto.Marshal(ToProto(o))
	if err != nil {
		return nil, fmt.Errorf("api: encode override %q: %w", o.Key, err)
	}
	return b, nil
}

// decode decodes the record rk, value. It checks what the record must
// hold, not the limits of this node's configuration: an override stored
// under other settings still loads.
func decode(rk string, value []byte) (*Override, error) {
	key, prefix, ok := ParseRecordKey(rk)
	if !ok {
		return nil, fmt.Errorf("record key does not start with %q or %q", exactMarker, prefixMarker)
	}
	var po sluicepb.Override
	if err := proto.Unmarshal(value, &po); err != nil {
		return nil, err
	}
	if string(po.Key) != key || po.Prefix != prefix {
		return nil, fmt.Errorf("holds the override of %q (prefix %t)", po.Key, po.Prefix)
	}
	o := &Override{Key: key, Prefix: prefix, Limit: po.Limit, Note: po.Note}
	if po.Limit < 0 {
		return nil, fmt.Errorf("negative limit %d", po.Limit)
	}
	if po.Window != nil {
		if err := po.Window.CheckValid(); err != nil {
			return nil, err
		}
		if o.Window = po.Window.AsDuration(); o.Window < 0 {
			return nil, fmt.Errorf("negative window %v", o.Window)
		}
	}
	if po.Algorithm != sluicepb.Algorithm_ALGORITHM_UNSPECIFIED {
		algo, ok := cluster.AlgorithmFromProto(po.Algorithm)
		if !ok {
			return nil, fmt.Errorf("algorithm: unknown value %d (want 1 sliding log, 2 sliding window or 3 token bucket)", po.Algorithm)
		}
		o.Algorithm, o.HasAlgorithm = algo, true
	}
	for _, ts := range []*timestamppb.Timestamp{po.ExpiresAt, po.SetAt} {
		if ts != nil {
			if err := ts.CheckValid(); err != nil {
				return nil, err
			}
		}
	}
	if po.ExpiresAt != nil {
		o.ExpiresAt = po.ExpiresAt.AsTime()
	}
	if po.SetAt != nil {
		o.SetAt = po.SetAt.AsTime()
	}
	return o, nil
}

// ToProto is o as the API shows it.
func ToProto(o *Override) *sluicepb.Override {
	po := &sluicepb.Override{Key: []byte(o.Key), Prefix: o.Prefix, Limit: o.Limit, Note: o.Note}
	if o.Window > 0 {
		po.Window = durationpb.New(o.Window)
	}
	if o.HasAlgorithm {
		po.Algorithm = cluster.AlgorithmToProto(o.Algorithm)
	}
	if !o.ExpiresAt.IsZero() {
		po.ExpiresAt = timestamppb.New(o.ExpiresAt)
	}
	if !o.SetAt.IsZero() {
		po.SetAt = timestamppb.New(o.SetAt)
	}
	return po
}
