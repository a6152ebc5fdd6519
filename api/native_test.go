package api

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// nativeCheck is apitest.Check: a native check of cost hits on key.
var nativeCheck = apitest.Check

// TestNativeExactUnderConcurrency: callers on many connections hitting one
// key get exactly its limit allowed.
func TestNativeExactUnderConcurrency(t *testing.T) {
	ts := newTestServer(t, nil)
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				resp, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("hot", 100, time.Minute, 1)}})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.Decisions[0].Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := allowed.Load(); got != 100 {
		t.Fatalf("400 hits on a limit of 100: %d allowed; want exactly 100", got)
	}
}

// TestNativeBadInput: every malformed request gets InvalidArgument with a
// message, and records nothing.
func TestNativeBadInput(t *testing.T) {
	ts := newTestServer(t, nil)
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	good := nativeCheck("good", 10, time.Minute, 1)
	tests := []struct {
		name string
		bad  *sluicepb.Check
	}{
		{"empty key", nativeCheck("", 10, time.Minute, 1)},
		{"long key", nativeCheck(string(make([]byte, 1025)), 10, time.Minute, 1)},
		{"no limit anywhere", nativeCheck("x", 0, time.Minute, 1)},
		{"negative limit", nativeCheck("x", -3, time.Minute, 1)},
		{"no window", &sluicepb.Check{Key: []byte("x"), Limit: 10}},
		{"window too long", nativeCheck("x", 10, 4000*24*time.Hour, 1)},
		{"negative cost", nativeCheck("x", 10, time.Minute, -1)},
		{"cost above limit", nativeCheck("x", 10, time.Minute, 11)},
		{"unknown algorithm", &sluicepb.Check{Key: []byte("x"), Limit: 10, Window: durationpb.New(time.Minute), Algorithm: 42}},
		{"key and key_text", &sluicepb.Check{Key: []byte("x"), KeyText: "x", Limit: 10, Window: durationpb.New(time.Minute)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{good, tt.bad}})
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() == "" {
				t.Fatalf("Check(good, %v) = %v; want InvalidArgument with a message", tt.bad, err)
			}
		})
	}
	_, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Check(no checks) = %v; want InvalidArgument", err)
	}
	many := make([]*sluicepb.Check, 1001)
	for i := range many {
		many[i] = nativeCheck(fmt.Sprint(i), 10, time.Minute, 1)
	}
	if _, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: many}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Check(1001 checks) = %v; want InvalidArgument", err)
	}
	resp, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("good", 10, time.Minute, 0)}})
	if err != nil || resp.Decisions[0].Remaining != 10 {
		t.Fatalf("peek at good after refused calls = %v, %v; want 10 remaining (nothing recorded)", resp, err)
	}
}

// TestNativeKeyText: key_text names the same key as key's bytes, for
// clients that write JSON by hand, and the admin API shows keys as text.
func TestNativeKeyText(t *testing.T) {
	ts := newTestServer(t, nil)
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	text := &sluicepb.Check{KeyText: "tenant:42", Limit: 2, Window: durationpb.New(time.Minute)}
	for i, want := range []bool{true, true, false} {
		c := text
		if i == 1 {
			c = nativeCheck("tenant:42", 2, time.Minute, 1)
		}
		resp, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{c}})
		if err != nil || resp.Decisions[0].Allowed != want {
			t.Fatalf("check %d of tenant:42 (limit 2), alternately by key_text and key = %v, %v; want allowed %v", i, resp, err, want)
		}
	}
	admin := sluicepb.NewAdminServiceClient(ts.conn)
	got, err := admin.GetKey(ts.ctx(), &sluicepb.GetKeyRequest{Key: []byte("tenant:42")})
	if err != nil || got.State.KeyText != "tenant:42" || got.State.Used != 2 {
		t.Fatalf("GetKey(tenant:42) = %v, %v; want key_text tenant:42, 2 used", got, err)
	}
	list, err := admin.ListKeys(ts.ctx(), &sluicepb.ListKeysRequest{Prefix: []byte("tenant:")})
	if err != nil || len(list.Keys) != 1 || list.Keys[0].KeyText != "tenant:42" {
		t.Fatalf("ListKeys(tenant:) = %v, %v; want tenant:42 with its key_text", list, err)
	}
}

// TestNativeMissingLimitOrWindow: a check that ends up without a limit or
// a window (none sent, no override, no limits file entry) is refused with
// a message that says which is missing, and an errdetails.BadRequest that
// names the field, for clients to point at their own flag or setting.
func TestNativeMissingLimitOrWindow(t *testing.T) {
	ts := newTestServer(t, nil)
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	for _, tc := range []struct {
		name       string
		check      *sluicepb.Check
		wantFields []string
		wantMsg    string
	}{
		{"limit without window", &sluicepb.Check{Key: []byte("k"), Limit: 3}, []string{"checks[1].window"}, "no window: the limit is 3"},
		{"zero window", &sluicepb.Check{Key: []byte("k"), Limit: 3, Window: durationpb.New(0)}, []string{"checks[1].window"}, "no window"},
		{"window without limit", &sluicepb.Check{Key: []byte("k"), Window: durationpb.New(time.Minute)}, []string{"checks[1].limit"}, "no limit: the window is 1m0s"},
		{"neither", &sluicepb.Check{Key: []byte("k")}, []string{"checks[1].limit", "checks[1].window"}, "no limit and no window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("good", 10, time.Minute, 1), tc.check}})
			st := status.Convert(err)
			var fields []string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					for _, v := range br.FieldViolations {
						fields = append(fields, v.Field)
					}
				}
			}
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantMsg) || !slices.Equal(fields, tc.wantFields) {
				t.Errorf("Check(good, %v) = %v, field violations %q; want InvalidArgument saying %q, field violations %q", tc.check, err, fields, tc.wantMsg, tc.wantFields)
			}
		})
	}
}

// TestNativeAllOrNothingAndRestart: all_or_nothing records nothing when one
// check fails; recorded hits survive a restart.
func TestNativeAllOrNothingAndRestart(t *testing.T) {
	ts := newTestServer(t, nil)
	client := sluicepb.NewRateLimitServiceClient(ts.conn)
	req := &sluicepb.CheckRequest{AllOrNothing: true, Checks: []*sluicepb.Check{
		nativeCheck("a", 5, time.Minute, 3), nativeCheck("b", 5, time.Minute, 3), nativeCheck("b", 5, time.Minute, 3),
	}}
	resp, err := client.Check(ts.ctx(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range resp.Decisions {
		if d.Allowed || d.Node != "test-node" {
			t.Errorf("decision %d = %v; want denied by test-node (b twice is 6 > 5)", i, d)
		}
	}
	req.Checks = req.Checks[:2]
	if resp, err = client.Check(ts.ctx(), req); err != nil || !resp.Decisions[0].Allowed || !resp.Decisions[1].Allowed {
		t.Fatalf("Check(a, b) = %v, %v; want both allowed", resp, err)
	}
	ts.restart()
	client = sluicepb.NewRateLimitServiceClient(ts.conn)
	resp, err = client.Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("a", 5, time.Minute, 0), nativeCheck("b", 5, time.Minute, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range resp.Decisions {
		if d.Remaining != 2 {
			t.Errorf("after restart, key %d has %d remaining; want 2 (no free window)", i, d.Remaining)
		}
	}
}

// TestNativeJoiningRefuses: a node of a cluster serves gRPC before it has
// joined; until then its checks are refused, never decided by its engine
// alone (which would ignore who owns the key and whether it holds a
// lease).
func TestNativeJoiningRefuses(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.Clustered = true })
	_, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{nativeCheck("k", 5, time.Minute, 1)}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "joining") {
		t.Fatalf("Check on a node still joining its cluster = %v; want Unavailable, still joining", err)
	}
	if _, err := ts.admin().ResetKey(ts.ctx(), &sluicepb.ResetKeyRequest{Key: []byte("k")}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ResetKey on a node still joining = %v; want Unavailable", err)
	}
}

// TestHugeKeyNotEchoed: a check with a 3 MiB key and no limit is refused
// with a message that quotes only the key's first 64 bytes, not the key.
func TestHugeKeyNotEchoed(t *testing.T) {
	ts := newTestServer(t, nil)
	key := bytes.Repeat([]byte("k"), 3<<20)
	_, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{{Key: key}}})
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || len(st.Message()) > 300 || !strings.Contains(st.Message(), "(3145728 bytes)") {
		t.Errorf("a 3 MiB key without a limit: %v, a message of %d bytes (%.120q...); want InvalidArgument quoting 64 bytes of the key and its length", st.Code(), len(st.Message()), st.Message())
	}
}

// rawCodec sends bytes as they are, whatever protobuf they are (not).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// TestUndecodableRequest: a request that is not valid protobuf is the
// caller's fault: INVALID_ARGUMENT, on the native, Envoy and admin APIs,
// and nothing is recorded.
func TestUndecodableRequest(t *testing.T) {
	ts := newTestServer(t, nil)
	garbage := []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f} // field 1, a length past the end
	for _, method := range []string{
		"/sluice.v1.RateLimitService/Check",
		"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		"/sluice.v1.AdminService/GetKey",
	} {
		var out []byte
		err := ts.conn.Invoke(ts.ctx(), method, garbage, &out, grpc.ForceCodecV2(rawCodec{}))
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "not a valid") {
			t.Errorf("%s with undecodable bytes: %v; want InvalidArgument saying the request is not valid protobuf", method, err)
		}
	}
}
