package overrides

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

var epoch = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// FuzzDecodeOverride: decoding any record never panics, and what decodes
// encodes back to a record that decodes the same.
func FuzzDecodeOverride(f *testing.F) {
	for _, o := range []*Override{
		{Key: "k", Limit: 5},
		{Key: "", Prefix: true, Window: time.Hour, ExpiresAt: epoch, SetAt: epoch, Note: "n"},
	} {
		b, err := encode(o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(RecordKey(o.Key, o.Prefix), b)
	}
	f.Add("=x", []byte{0xff})
	f.Fuzz(func(t *testing.T, rk string, value []byte) {
		o, err := decode(rk, value)
		if err != nil {
			return
		}
		b, err := encode(o)
		if err != nil {
			t.Fatalf("encode(%+v) = %v", o, err)
		}
		again, err := decode(RecordKey(o.Key, o.Prefix), b)
		if err != nil {
			t.Fatalf("decode of re-encoded %+v = %v", o, err)
		}
		if !proto.Equal(ToProto(again), ToProto(o)) {
			t.Fatalf("round trip of %+v = %+v", o, again)
		}
	})
}
