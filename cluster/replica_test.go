package cluster

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
	"google.golang.org/protobuf/proto"
)

// BenchmarkReplicateMessage measures what the generated code costs a
// Replicate call of 32 copies (about what a commit sends one standby at
// saturation) on each side: the sender's building and encoding of the
// message from the engine's records, as replicaLane.sendBatch does, and
// the standby's decoding of it into records, as receiveReplicas and
// submitReplicas do (docs/benchmarks.md, "Standbys").
func BenchmarkReplicateMessage(b *testing.B) {
	recs := make([]persist.Record, 32)
	for i := range recs {
		recs[i] = persist.Record{Key: fmt.Sprintf("bench|key=bench:%d", i*311), Deadline: 1 << 61, Value: make([]byte, 24), Append: true}
	}
	encode := func() []byte {
		req := &sluicepb.ReplicateRequest{FromNode: "node-1", FromEpoch: 1 << 40, ToNode: "node-2", ToEpoch: 1 << 41,
			MapVersion: 17, Sequence: 1 << 60, Records: make([]*sluicepb.StoreRecord, 0, len(recs))}
		for _, rec := range recs {
			req.Records = append(req.Records, &sluicepb.StoreRecord{Key: []byte(rec.Key), Deadline: rec.Deadline, Value: rec.Value, Append: rec.Append})
		}
		data, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	data := encode()
	b.Run("send", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encode()
		}
	})
	b.Run("receive", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req sluicepb.ReplicateRequest
			if err := proto.Unmarshal(data, &req); err != nil {
				b.Fatal(err)
			}
			out := make([]persist.Record, len(req.Records))
			for i, pr := range req.Records {
				out[i] = persist.Record{Key: string(pr.Key), Deadline: pr.Deadline, Value: pr.Value, Append: pr.Append}
			}
			if len(out) != len(recs) || out[31].Key != recs[31].Key {
				b.Fatalf("decoded %d records, the last %q", len(out), out[len(out)-1].Key)
			}
		}
	})
}
