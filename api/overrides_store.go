package api

import (
	"encoding/base64"
	"fmt"
	"strings"

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

// overridesBucket is the meta bucket that holds the overrides.
const overridesBucket = "overrides"

// Markers that start an override's record key.
const (
	exactMarker  = '='
	prefixMarker = '*'
)

// overrideRecordKey is the record key of the override with key and prefix
// flag. ListOverrides page tokens are this, base64url-encoded.
func overrideRecordKey(key string, prefix bool) string {
	if prefix {
		return string(prefixMarker) + key
	}
	return string(exactMarker) + key
}

// parseOverrideRecordKey is the inverse of overrideRecordKey.
func parseOverrideRecordKey(rk string) (key string, prefix, ok bool) {
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

// loadOverrides reads the overrides stored in st, expired ones included:
// match never applies them and listings skip them, and the next
// SetOverride or DeleteOverride deletes them from the file.
func loadOverrides(st *persist.Store) ([]*Override, error) {
	var list []*Override
	var bad error
	err := st.ScanMeta(overridesBucket, func(rk string, value []byte) bool {
		o, err := decodeOverride(rk, value)
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

// encodeOverride returns the record value of o.
func encodeOverride(o *Override) ([]byte, error) {
	b, err := proto.Marshal(toProtoOverride(o))
	if err != nil {
		return nil, fmt.Errorf("api: encode override %q: %w", o.Key, err)
	}
	return b, nil
}

// decodeOverride decodes the record rk, value. It checks what the record
// must hold, not the limits of this node's configuration: an override stored
// under other settings still loads.
func decodeOverride(rk string, value []byte) (*Override, error) {
	key, prefix, ok := parseOverrideRecordKey(rk)
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
		algo, err := fromProtoAlgorithm(po.Algorithm)
		if err != nil {
			return nil, err
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

// toProtoOverride is o as the API shows it.
func toProtoOverride(o *Override) *sluicepb.Override {
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

// Page tokens. Both are base64url without padding (RFC 4648 §5), so they
// travel in URLs and shells as they are:
//
//   - ListKeys: the last key of the page.
//   - ListOverrides: the record key of the last override of the page
//     ("=" or "*", then its key; see overrideRecordKey).
//
// Clients must treat them as opaque.
var tokenEncoding = base64.RawURLEncoding

func encodeToken(s string) string { return tokenEncoding.EncodeToString([]byte(s)) }

// decodeToken decodes a page token; "" decodes to "".
func decodeToken(field, token string) (string, error) {
	b, err := tokenEncoding.DecodeString(token)
	if err != nil {
		return "", badInput("%s: %q is not a page token this server issued (pass next_page_token as it came, or empty for the first page)", field, truncate(token, 64))
	}
	return string(b), nil
}

// truncate shortens s to at most n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
