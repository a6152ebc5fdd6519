package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
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

// replicateRecorder is a PeerServiceClient whose Replicate stream keeps
// what was sent and answers each call at once.
type replicateRecorder struct {
	sluicepb.PeerServiceClient
	sent chan *sluicepb.ReplicateRequest
}

func (c *replicateRecorder) Replicate(ctx context.Context, _ ...grpc.CallOption) (sluicepb.PeerService_ReplicateClient, error) {
	return &recordedStream{ctx: ctx, sent: c.sent, answers: make(chan *sluicepb.ReplicateResponse, 16)}, nil
}

type recordedStream struct {
	grpc.ClientStream
	ctx     context.Context
	sent    chan *sluicepb.ReplicateRequest
	answers chan *sluicepb.ReplicateResponse
}

func (s *recordedStream) Send(req *sluicepb.ReplicateRequest) error {
	s.sent <- req
	s.answers <- &sluicepb.ReplicateResponse{Sequence: req.Sequence}
	return nil
}

func (s *recordedStream) Recv() (*sluicepb.ReplicateResponse, error) {
	select {
	case a := <-s.answers:
		return a, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

func (s *recordedStream) CloseSend() error { return nil }

// TestCopiesCarryTheirEpoch: a copy carries the epoch of this node it was
// written under, however late it leaves, and a call carries the copies of
// one epoch only. A copy queued under epoch 1 and sent once the node is at
// epoch 2 says epoch 1, so that a standby whose map ended epoch 1 refuses
// it. Before, every copy was stamped with the epoch current when its call
// left: a write of an ended epoch could reach the standby as the new
// epoch's.
func TestCopiesCarryTheirEpoch(t *testing.T) {
	r, err := NewRouter(RouterConfig{Clustered: true, Self: "n1", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	r.own.Store(&ownership{epoch: 2}) // the node moved on to epoch 2
	sent := make(chan *sluicepb.ReplicateRequest, 4)
	s := &standbySender{r: r, name: "n2", epoch: 7, p: &peer{client: &replicateRecorder{sent: sent}}, quit: make(chan struct{})}
	l := &replicaLane{s: s, wake: make(chan struct{}, 1)}
	s.lanes[0] = l
	result := make(chan error, 2)
	deadline := time.Now().Add(5 * time.Second)
	l.enqueue(&replItem{recs: []persist.Record{{Key: "k1", Value: []byte{1}}}, deadline: deadline, result: result, epoch: 1})
	l.enqueue(&replItem{recs: []persist.Record{{Key: "k2", Value: []byte{2}}}, deadline: deadline, result: result, epoch: 2})
	for l.sendBatch() {
	}
	type call struct {
		epoch uint64
		keys  string
	}
	var got []call
	for len(sent) > 0 {
		req := <-sent
		var keys []string
		for _, rec := range req.Records {
			keys = append(keys, string(rec.Key))
		}
		got = append(got, call{req.FromEpoch, strings.Join(keys, ",")})
	}
	want := []call{{1, "k1"}, {2, "k2"}}
	if !slices.Equal(got, want) {
		t.Errorf("copies written under epochs 1 (k1) and 2 (k2), sent at epoch 2: calls (from_epoch, keys) = %v; want %v", got, want)
	}
	for range 2 {
		if err := <-result; err != nil {
			t.Errorf("copy: %v", err)
		}
	}
	s.close()
	l.mu.Lock()
	st := l.st
	l.mu.Unlock()
	if st != nil {
		l.broke(st, errors.New("test over"))
	}
	r.wg.Wait()
}

// TestStandbyRefusesEndedEpochs: a standby takes copies only from an owner
// whose epoch is live in the map it applied, and only when they are meant
// for its own current epoch. A copy from an owner whose epoch ended (a late
// write of a node cut off, arriving once its keys went on from this
// standby's copy) is refused before it touches anything.
func TestStandbyRefusesEndedEpochs(t *testing.T) {
	m := testMap(9, live("a", 4), ended("b", true), live("c", 6))
	m.Members[1].Epoch = 5 // b's last epoch, ended
	r := &Router{cfg: RouterConfig{Self: "c"}}
	r.own.Store(&ownership{cur: newConfig("c", PolicyExact, 2, m), epoch: 6})
	for _, tc := range []struct {
		name string
		req  *sluicepb.ReplicateRequest
	}{
		{"from an ended epoch", &sluicepb.ReplicateRequest{FromNode: "b", FromEpoch: 5, ToNode: "c", ToEpoch: 6, Sequence: 1}},
		{"from an epoch the map does not know", &sluicepb.ReplicateRequest{FromNode: "a", FromEpoch: 3, ToNode: "c", ToEpoch: 6, Sequence: 1}},
		{"meant for another epoch of this node", &sluicepb.ReplicateRequest{FromNode: "a", FromEpoch: 4, ToNode: "c", ToEpoch: 2, Sequence: 1}},
		{"meant for another node", &sluicepb.ReplicateRequest{FromNode: "a", FromEpoch: 4, ToNode: "b", ToEpoch: 6, Sequence: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Records = []*sluicepb.StoreRecord{{Key: []byte("k"), Value: []byte{1}, Append: true}}
			var ack *replicaAck
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("accepted: it went on to store the copy (%v)", p)
					}
				}()
				ack, err = r.submitReplicas(context.Background(), tc.req)
			}()
			if ack != nil || !errors.Is(err, errWrongEpoch) {
				t.Fatalf("submitReplicas(from %s epoch %d, to %s epoch %d) = %v, %v; want refused as %v",
					tc.req.FromNode, tc.req.FromEpoch, tc.req.ToNode, tc.req.ToEpoch, ack, err, errWrongEpoch)
			}
		})
	}
}
