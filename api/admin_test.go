package api

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/api/limits"
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/persist"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// adminClient is an admin client on ts's connection.
func (ts *testServer) admin() sluicepb.AdminServiceClient {
	return sluicepb.NewAdminServiceClient(ts.conn)
}

// hit sends one check and returns its decision, failing the test on error.
func (ts *testServer) hit(c *sluicepb.Check) *sluicepb.Decision {
	ts.t.Helper()
	resp, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ts.ctx(), &sluicepb.CheckRequest{Checks: []*sluicepb.Check{c}})
	if err != nil {
		ts.t.Fatalf("Check(%v) = %v; want no error", c, err)
	}
	return resp.Decisions[0]
}

// getKey returns GetKey(key), failing the test on error.
func (ts *testServer) getKey(key string) *sluicepb.KeyState {
	ts.t.Helper()
	resp, err := ts.admin().GetKey(ts.ctx(), &sluicepb.GetKeyRequest{Key: []byte(key)})
	if err != nil {
		ts.t.Fatalf("GetKey(%q) = %v; want no error", key, err)
	}
	return resp.State
}

// setOverride sets o, failing the test on error.
func (ts *testServer) setOverride(o *sluicepb.Override) *sluicepb.Override {
	ts.t.Helper()
	resp, err := ts.admin().SetOverride(ts.ctx(), &sluicepb.SetOverrideRequest{Override: o})
	if err != nil {
		ts.t.Fatalf("SetOverride(%v) = %v; want no error", o, err)
	}
	return resp.Override
}

// listOverrides returns every override through pages of size.
func (ts *testServer) listOverrides(prefix string, size int32) []*sluicepb.Override {
	ts.t.Helper()
	var all []*sluicepb.Override
	req := &sluicepb.ListOverridesRequest{Prefix: []byte(prefix), PageSize: size}
	for page := 0; ; page++ {
		resp, err := ts.admin().ListOverrides(ts.ctx(), req)
		if err != nil {
			ts.t.Fatalf("ListOverrides(%v) = %v; want no error", req, err)
		}
		all = append(all, resp.Overrides...)
		if resp.NextPageToken == "" {
			return all
		}
		if page > 1000 {
			ts.t.Fatalf("ListOverrides: more than 1000 pages")
		}
		req.PageToken = resp.NextPageToken
	}
}

// overrideNames names overrides as "key" or "key*" for messages and
// comparisons.
func overrideNames(list []*sluicepb.Override) []string {
	var out []string
	for _, o := range list {
		name := string(o.Key)
		if o.Prefix {
			name += "*"
		}
		out = append(out, name)
	}
	return out
}

// limitOf sends a check on key with limit 100 per minute and returns the
// limit it was decided against.
func (ts *testServer) limitOf(key string) int64 {
	ts.t.Helper()
	return ts.hit(nativeCheck(key, 100, time.Minute, 0)).Limit
}

func wantCode(t *testing.T, call string, err error, code codes.Code) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || st.Message() == "" {
		t.Errorf("%s = %v; want %v with a message", call, err, code)
	}
}

// TestAdminGetKeyAgreesWithDecisions: for every algorithm, GetKey shows the
// counts the last decision announced, and the algorithm's counters.
func TestAdminGetKeyAgreesWithDecisions(t *testing.T) {
	ts := newTestServer(t, nil)

	t.Run("sliding log", func(t *testing.T) {
		t0 := ts.clk.Now()
		ts.hit(nativeCheck("log", 5, time.Minute, 2))
		ts.clk.Advance(10 * time.Second)
		ts.hit(nativeCheck("log", 5, time.Minute, 3))
		last := ts.hit(nativeCheck("log", 5, time.Minute, 1))
		if last.Allowed {
			t.Fatalf("sixth hit on a limit of 5 allowed: %v", last)
		}
		got := ts.getKey("log")
		now := ts.clk.Now()
		want := &sluicepb.KeyState{
			Key:        []byte("log"),
			KeyText:    "log",
			Found:      true,
			Algorithm:  sluicepb.Algorithm_ALGORITHM_SLIDING_LOG,
			Limit:      5,
			Window:     durationpb.New(time.Minute),
			Counters:   &sluicepb.KeyState_SlidingLog{SlidingLog: &sluicepb.SlidingLogState{Runs: []*sluicepb.LogRun{{Time: timestamppb.New(t0), Count: 2}, {Time: timestamppb.New(now), Count: 3}}}},
			Used:       5,
			Remaining:  last.Remaining,
			RetryAfter: last.RetryAfter,
			ResetAfter: last.ResetAfter,
			ExpiresAt:  timestamppb.New(now.Add(last.ResetAfter.AsDuration())),
			InMemory:   true,
			Node:       "test-node",
			ReadAt:     timestamppb.New(now),
		}
		if !proto.Equal(got, want) {
			t.Errorf("after 2+3 hits and a denied one (last decision %v):\nGetKey = %v\nwant     %v", last, got, want)
		}
		if got.RetryAfter.AsDuration() != 50*time.Second || got.ResetAfter.AsDuration() != time.Minute {
			t.Errorf("GetKey retry_after %v, reset_after %v; want 50s (the first run expires), 1m (the second does)", got.RetryAfter.AsDuration(), got.ResetAfter.AsDuration())
		}
	})

	t.Run("sliding window", func(t *testing.T) {
		c := nativeCheck("window", 10, time.Minute, 4)
		c.Algorithm = sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW
		last := ts.hit(c)
		got := ts.getKey("window")
		sw := got.GetSlidingWindow()
		if sw == nil {
			t.Fatalf("GetKey(window) = %v; want sliding_window counters", got)
		}
		now := ts.clk.Now()
		start := sw.BucketStart.AsTime()
		if sw.Previous != 0 || sw.Current != 4 || start.After(now) || !start.After(now.Add(-time.Minute)) {
			t.Errorf("sliding window counters after 4 hits at %v = %v; want previous 0, current 4, a bucket holding now", now, sw)
		}
		if got.Algorithm != sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW || got.Used != 4 || got.Remaining != last.Remaining || got.Remaining != 6 ||
			!proto.Equal(got.ResetAfter, last.ResetAfter) || got.RetryAfter.AsDuration() != 0 || !got.InMemory {
			t.Errorf("GetKey(window) = %v; want algorithm sliding window, used 4, remaining 6, reset_after %v as decided (%v), retry 0, in memory", got, last.ResetAfter.AsDuration(), last)
		}
	})

	t.Run("token bucket", func(t *testing.T) {
		c := nativeCheck("bucket", 10, 10*time.Second, 4)
		c.Algorithm = sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET
		last := ts.hit(c)
		updated := ts.clk.Now()
		got := ts.getKey("bucket")
		tb := got.GetTokenBucket()
		if tb == nil || tb.Tokens != 6 || !tb.Updated.AsTime().Equal(updated) {
			t.Fatalf("GetKey(bucket) = %v; want token_bucket counters of 6 tokens at %v", got, updated)
		}
		if got.Used != 4 || got.Remaining != last.Remaining || !proto.Equal(got.ResetAfter, last.ResetAfter) {
			t.Errorf("GetKey(bucket) = %v; want used 4, remaining and reset_after as decided (%v)", got, last)
		}
		// One second refills one token; the counters stay as of the last hit.
		ts.clk.Advance(time.Second)
		got = ts.getKey("bucket")
		if tb := got.GetTokenBucket(); got.Used != 3 || got.Remaining != 7 || tb.Tokens != 6 || !tb.Updated.AsTime().Equal(updated) {
			t.Errorf("GetKey(bucket) 1s later = %v; want used 3, remaining 7, tokens 6 at %v", got, updated)
		}
	})

	t.Run("unknown key", func(t *testing.T) {
		got := ts.getKey("never")
		want := &sluicepb.KeyState{Key: []byte("never"), KeyText: "never", Node: "test-node", ReadAt: timestamppb.New(ts.clk.Now())}
		if !proto.Equal(got, want) {
			t.Errorf("GetKey(never) = %v; want %v", got, want)
		}
	})
}

// TestAdminKeyOnDisk: a key evicted from memory is still shown, with
// in_memory false, by GetKey and ListKeys, and still counts.
func TestAdminKeyOnDisk(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) {
		c.Engine.Actors = 1
		c.Engine.MaxKeys = 2
	})
	ts.hit(nativeCheck("cold", 3, time.Minute, 2))
	before := ts.getKey("cold")
	if !before.InMemory {
		t.Fatalf("GetKey(cold) right after a check = %v; want in memory", before)
	}
	// Other keys push it out of memory once its write is done.
	for i := 0; ts.getKey("cold").InMemory; i++ {
		if i == 100 {
			t.Fatalf("cold still in memory after 100 other keys with max keys 2")
		}
		ts.hit(nativeCheck(fmt.Sprintf("filler-%03d", i), 3, time.Minute, 1))
	}
	got := ts.getKey("cold")
	if !got.Found || got.Used != 2 || got.Remaining != 1 || len(got.GetSlidingLog().GetRuns()) != 1 {
		t.Errorf("GetKey(cold) from disk = %v; want found, used 2, remaining 1, one run", got)
	}
	resp, err := ts.admin().ListKeys(ts.ctx(), &sluicepb.ListKeysRequest{Prefix: []byte("cold")})
	if err != nil || len(resp.Keys) != 1 || resp.Keys[0].InMemory || string(resp.Keys[0].Key) != "cold" ||
		!proto.Equal(resp.Keys[0].ExpiresAt, got.ExpiresAt) || resp.Keys[0].Node != "test-node" {
		t.Errorf("ListKeys(prefix cold) = %v, %v; want cold, not in memory, expiring at %v, on test-node", resp, err, got.ExpiresAt.AsTime())
	}
	if d := ts.hit(nativeCheck("cold", 3, time.Minute, 2)); d.Allowed {
		t.Errorf("2 more hits on cold (2 of 3 used, on disk) = %v; want denied", d)
	}
}

// TestAdminGetKeyLocal: a local GetKey reads the node asked, not the
// key's owner: its own state of the key (as GetKey shows it) and its
// standby copy, each found only where it is kept.
func TestAdminGetKeyLocal(t *testing.T) {
	ts := newTestServer(t, nil)
	ctx := context.Background()
	ts.hit(nativeCheck("mine", 10, time.Minute, 3))
	// A standby copy of a key another node decides: the same state, as
	// replication would write it.
	states, err := ts.engine.Get(ctx, []string{"mine"})
	if err != nil || len(states) != 1 {
		t.Fatalf("engine.Get(mine) = %v, %v; want one state", states, err)
	}
	if err := ts.engine.PutReplicas(ctx, []persist.Record{{Key: "theirs", Value: states[0].State, Deadline: states[0].Deadline}}); err != nil {
		t.Fatal(err)
	}
	local := func(key string) *sluicepb.GetKeyResponse {
		t.Helper()
		resp, err := ts.admin().GetKey(ts.ctx(), &sluicepb.GetKeyRequest{Key: []byte(key), Local: true})
		if err != nil {
			t.Fatalf("GetKey(%q, local) = %v; want no error", key, err)
		}
		return resp
	}
	for _, tc := range []struct {
		key                    string
		wantState, wantReplica int64 // used; -1: not found
	}{
		{"mine", 3, -1},
		{"theirs", -1, 3},
		{"nobody", -1, -1},
	} {
		resp := local(tc.key)
		for _, part := range []struct {
			what string
			ks   *sluicepb.KeyState
			want int64
		}{{"state", resp.State, tc.wantState}, {"replica", resp.Replica, tc.wantReplica}} {
			ks := part.ks
			if ks == nil || string(ks.Key) != tc.key || ks.Node != "test-node" || ks.Found != (part.want >= 0) || part.want >= 0 && ks.Used != part.want {
				t.Errorf("GetKey(%q, local).%s = %v; want key %q on test-node, found %v, used %d", tc.key, part.what, ks, tc.key, part.want >= 0, part.want)
			}
		}
	}
	if got, want := local("mine").State, ts.getKey("mine"); got.Used != want.Used || !proto.Equal(got.GetSlidingLog(), want.GetSlidingLog()) {
		t.Errorf("GetKey(mine, local).state = %v; want what GetKey(mine) shows: %v", got, want)
	}
	if r := local("theirs").Replica; r.InMemory || len(r.GetSlidingLog().GetRuns()) != 1 || r.Limit != 10 {
		t.Errorf("GetKey(theirs, local).replica = %v; want on disk only, one run, limit 10", r)
	}
	// Without local, the node answers for its own keys only: the copy
	// is not a key of its own.
	if got := ts.getKey("theirs"); got.Found {
		t.Errorf("GetKey(theirs) = %v; want not found: a standby copy is not the node's key", got)
	}
}

// TestAdminListKeysPages: pages cover every key of the prefix once, in
// order, and the last page says so.
func TestAdminListKeysPages(t *testing.T) {
	ts := newTestServer(t, nil)
	var want []string
	for i := range 25 {
		key := fmt.Sprintf("page:%02d", i)
		want = append(want, key)
		ts.hit(nativeCheck(key, 10, time.Minute, 1))
	}
	ts.hit(nativeCheck("other", 10, time.Minute, 1))
	ts.hit(nativeCheck("pag", 10, time.Minute, 1))

	list := func(prefix string, size int32) (keys []string, pages []int) {
		t.Helper()
		req := &sluicepb.ListKeysRequest{Prefix: []byte(prefix), PageSize: size}
		for {
			resp, err := ts.admin().ListKeys(ts.ctx(), req)
			if err != nil {
				t.Fatalf("ListKeys(%v) = %v; want no error", req, err)
			}
			for _, k := range resp.Keys {
				keys = append(keys, string(k.Key))
				if !k.InMemory || k.ExpiresAt == nil || k.Node != "test-node" {
					t.Errorf("ListKeys: %v; want in memory, with expires_at, on test-node", k)
				}
			}
			pages = append(pages, len(resp.Keys))
			if resp.NextPageToken == "" {
				return keys, pages
			}
			if len(pages) > 100 {
				t.Fatalf("ListKeys(%q, %d): more than 100 pages", prefix, size)
			}
			req.PageToken = resp.NextPageToken
		}
	}

	keys, pages := list("page:", 10)
	if !slices.Equal(keys, want) || !slices.Equal(pages, []int{10, 10, 5}) {
		t.Errorf("ListKeys(page:, size 10) = %q in pages of %v; want %q in pages of [10 10 5]", keys, pages, want)
	}
	// Exactly a page's worth: one page, no empty page after it.
	keys, pages = list("page:1", 10)
	if !slices.Equal(keys, want[10:20]) || !slices.Equal(pages, []int{10}) {
		t.Errorf("ListKeys(page:1, size 10) = %q in pages of %v; want %q in one page", keys, pages, want[10:20])
	}
	all := append([]string{"other", "pag"}, want...)
	slices.Sort(all)
	for _, size := range []int32{0, 1, 7, 5000} {
		keys, _ = list("", size)
		if !slices.Equal(keys, all) {
			t.Errorf("ListKeys(all, size %d) = %q; want %q", size, keys, all)
		}
	}
	if keys, _ = list("nothing", 0); len(keys) != 0 {
		t.Errorf("ListKeys(nothing) = %q; want none", keys)
	}
}

// TestAdminResetKey: a reset key has its whole limit at once and after a
// restart (no state comes back from disk).
func TestAdminResetKey(t *testing.T) {
	ts := newTestServer(t, nil)
	ts.hit(nativeCheck("r", 3, time.Minute, 3))
	if d := ts.hit(nativeCheck("r", 3, time.Minute, 1)); d.Allowed {
		t.Fatalf("fourth hit on a limit of 3 = %v; want denied", d)
	}
	resp, err := ts.admin().ResetKey(ts.ctx(), &sluicepb.ResetKeyRequest{Key: []byte("r")})
	if err != nil || !resp.Existed {
		t.Fatalf("ResetKey(r) = %v, %v; want existed", resp, err)
	}
	if got := ts.getKey("r"); got.Found {
		t.Errorf("GetKey(r) after reset = %v; want not found", got)
	}
	if d := ts.hit(nativeCheck("r", 3, time.Minute, 0)); !d.Allowed || d.Remaining != 3 {
		t.Errorf("peek after reset = %v; want allowed, remaining 3", d)
	}
	ts.restart()
	if got := ts.getKey("r"); got.Found {
		t.Errorf("GetKey(r) after reset and restart = %v; want not found", got)
	}
	if d := ts.hit(nativeCheck("r", 3, time.Minute, 1)); !d.Allowed || d.Remaining != 2 {
		t.Errorf("hit after reset and restart = %v; want allowed, remaining 2", d)
	}
	resp, err = ts.admin().ResetKey(ts.ctx(), &sluicepb.ResetKeyRequest{Key: []byte("never")})
	if err != nil || resp.Existed {
		t.Errorf("ResetKey(never) = %v, %v; want not existed", resp, err)
	}
}

// TestAdminOverrideMatching: an exact override beats any prefix override,
// the longest prefix wins, an override wins over the values a check sends,
// and each change applies to the very next check.
func TestAdminOverrideMatching(t *testing.T) {
	ts := newTestServer(t, nil)
	ts.setOverride(&sluicepb.Override{Key: []byte("t:"), Prefix: true, Limit: 2})
	ts.setOverride(&sluicepb.Override{Key: []byte("t:1"), Prefix: true, Limit: 3})
	ts.setOverride(&sluicepb.Override{Key: []byte("t:1x"), Limit: 5})
	ts.setOverride(&sluicepb.Override{Key: []byte("t:1x"), Prefix: true, Limit: 7})
	for _, tt := range []struct {
		key  string
		want int64
	}{
		{"t:9", 2},
		{"t:", 2},
		{"t:12", 3},
		{"t:1x", 5},
		{"t:1xy", 7},
		{"u", 100},
		{"t", 100},
	} {
		if got := ts.limitOf(tt.key); got != tt.want {
			t.Errorf("check on %q sending limit 100: decided against limit %d; want %d", tt.key, got, tt.want)
		}
	}

	del := func(key string, prefix, want bool) {
		t.Helper()
		resp, err := ts.admin().DeleteOverride(ts.ctx(), &sluicepb.DeleteOverrideRequest{Key: []byte(key), Prefix: prefix})
		if err != nil || resp.Existed != want {
			t.Errorf("DeleteOverride(%q, prefix %t) = %v, %v; want existed %t", key, prefix, resp, err, want)
		}
	}
	del("t:1x", false, true)
	if got := ts.limitOf("t:1x"); got != 7 {
		t.Errorf("after deleting the exact override of t:1x, its limit is %d; want 7 (its prefix override)", got)
	}
	del("t:1x", false, false)
	del("t:1", false, false) // only the prefix override of t:1 exists
	if got := ts.limitOf("t:12"); got != 3 {
		t.Errorf("after deleting a missing exact override of t:1, t:12 has limit %d; want 3", got)
	}
	del("t:1", true, true)
	if got := ts.limitOf("t:12"); got != 2 {
		t.Errorf("after deleting the prefix override t:1, t:12 has limit %d; want 2", got)
	}

	// An override gives what checks leave out, and its window and
	// algorithm win too.
	ts.setOverride(&sluicepb.Override{Key: []byte("v"), Limit: 4, Window: durationpb.New(time.Hour), Algorithm: sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET})
	d := ts.hit(&sluicepb.Check{Key: []byte("v")})
	if !d.Allowed || d.Limit != 4 {
		t.Errorf("check on v sending no limit nor window = %v; want allowed on limit 4 from the override", d)
	}
	if got := ts.getKey("v"); got.Algorithm != sluicepb.Algorithm_ALGORITHM_TOKEN_BUCKET || got.Window.AsDuration() != time.Hour {
		t.Errorf("GetKey(v) = %v; want a token bucket of window 1h, as the override says", got)
	}

	// The empty prefix override matches every key.
	ts.setOverride(&sluicepb.Override{Prefix: true, Limit: 9})
	if got := ts.limitOf("anything"); got != 9 {
		t.Errorf("with an override of every key, anything has limit %d; want 9", got)
	}
	if got := ts.limitOf("t:12"); got != 2 {
		t.Errorf("with an override of every key, t:12 has limit %d; want 2 (t: is longer)", got)
	}

	got := overrideNames(ts.listOverrides("", 0))
	want := []string{"*", "t:*", "t:1x*", "v"}
	if !slices.Equal(got, want) {
		t.Errorf("ListOverrides = %q; want %q", got, want)
	}
}

// TestAdminOverrideExpiry: an override applies until expires_at, then is
// neither applied nor listed, and expired overrides leave the data file.
func TestAdminOverrideExpiry(t *testing.T) {
	ts := newTestServer(t, nil)
	expires := ts.clk.Now().Add(time.Minute)
	set := ts.setOverride(&sluicepb.Override{Key: []byte("e"), Limit: 5, ExpiresAt: timestamppb.New(expires), Note: "INC-42"})
	want := &sluicepb.Override{Key: []byte("e"), Limit: 5, ExpiresAt: timestamppb.New(expires), Note: "INC-42", SetAt: timestamppb.New(ts.clk.Now())}
	if !proto.Equal(set, want) {
		t.Errorf("SetOverride = %v; want %v", set, want)
	}
	if got := ts.limitOf("e"); got != 5 {
		t.Errorf("before expiry, e has limit %d; want 5", got)
	}
	if got := ts.listOverrides("", 0); len(got) != 1 || !proto.Equal(got[0], want) {
		t.Errorf("ListOverrides before expiry = %v; want [%v]", got, want)
	}

	ts.clk.Advance(time.Minute)
	if got := ts.limitOf("e"); got != 100 {
		t.Errorf("at expires_at, e has limit %d; want 100 as sent", got)
	}
	if got := ts.listOverrides("", 0); len(got) != 0 {
		t.Errorf("ListOverrides after expiry = %v; want none", got)
	}
	resp, err := ts.admin().DeleteOverride(ts.ctx(), &sluicepb.DeleteOverrideRequest{Key: []byte("e")})
	if err != nil || resp.Existed {
		t.Errorf("DeleteOverride(e) after expiry = %v, %v; want not existed", resp, err)
	}

	// An expired override does not come back with a restart, and a write
	// removes expired ones from the file.
	ts.setOverride(&sluicepb.Override{Key: []byte("f"), Limit: 6, ExpiresAt: timestamppb.New(ts.clk.Now().Add(time.Minute))})
	ts.clk.Advance(time.Hour)
	ts.setOverride(&sluicepb.Override{Key: []byte("g"), Limit: 7})
	// Replacing an expired override keeps the new one.
	ts.setOverride(&sluicepb.Override{Key: []byte("h"), Limit: 8, ExpiresAt: timestamppb.New(ts.clk.Now().Add(time.Minute))})
	ts.clk.Advance(time.Hour)
	ts.setOverride(&sluicepb.Override{Key: []byte("h"), Limit: 9})
	ts.restart()
	if got := overrideNames(ts.listOverrides("", 0)); !slices.Equal(got, []string{"g", "h"}) {
		t.Errorf("ListOverrides after restart = %q; want [g h]", got)
	}
	if got := ts.limitOf("h"); got != 9 {
		t.Errorf("after restart, h has limit %d; want 9 (the override that replaced an expired one)", got)
	}
	var stored []string
	if err := ts.store.ScanMeta("overrides", func(k string, _ []byte) bool { stored = append(stored, k); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stored, []string{"=g", "=h"}) {
		t.Errorf("override records on disk = %q; want [=g =h]", stored)
	}
	if got := ts.limitOf("f"); got != 100 {
		t.Errorf("after restart, f (expired) has limit %d; want 100", got)
	}
}

// TestAdminOverridesSurviveRestart: overrides, exact and prefix of the same
// key apart, are the same after a restart, and so are deletions.
func TestAdminOverridesSurviveRestart(t *testing.T) {
	ts := newTestServer(t, nil)
	exact := ts.setOverride(&sluicepb.Override{Key: []byte("s"), Limit: 4, Note: "exact"})
	ts.clk.Advance(time.Second)
	prefix := ts.setOverride(&sluicepb.Override{Key: []byte("s"), Prefix: true, Window: durationpb.New(time.Hour),
		Algorithm: sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW, ExpiresAt: timestamppb.New(ts.clk.Now().Add(48 * time.Hour))})
	odd := ts.setOverride(&sluicepb.Override{Key: []byte("s\x00\xff"), Limit: 2})
	ts.restart()

	got := ts.listOverrides("", 0)
	want := []*sluicepb.Override{exact, prefix, odd}
	if len(got) != len(want) {
		t.Fatalf("ListOverrides after restart = %v; want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("ListOverrides after restart [%d] = %v; want %v", i, got[i], want[i])
		}
	}
	if got := ts.limitOf("s"); got != 4 {
		t.Errorf("after restart, s has limit %d; want 4", got)
	}
	ts.hit(nativeCheck("st", 100, time.Minute, 1))
	if got := ts.getKey("st"); got.Algorithm != sluicepb.Algorithm_ALGORITHM_SLIDING_WINDOW || got.Window.AsDuration() != time.Hour || got.Limit != 100 {
		t.Errorf("after restart, GetKey(st) after a hit = %v; want a sliding window of 1h (the prefix override) and limit 100 (as sent)", got)
	}

	if _, err := ts.admin().DeleteOverride(ts.ctx(), &sluicepb.DeleteOverrideRequest{Key: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	ts.restart()
	if got := overrideNames(ts.listOverrides("", 0)); !slices.Equal(got, []string{"s*", "s\x00\xff"}) {
		t.Errorf("ListOverrides after delete and restart = %q; want [s* s\\x00\\xff]", got)
	}
	if got := ts.limitOf("s"); got != 100 {
		t.Errorf("after deleting its override and a restart, s has limit %d; want 100", got)
	}
}

// TestAdminOverridesInMemoryMode: without a data file, overrides work and
// a restart forgets them.
func TestAdminOverridesInMemoryMode(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.Durability = "memory" })
	ts.setOverride(&sluicepb.Override{Key: []byte("m"), Limit: 3})
	if got := ts.limitOf("m"); got != 3 {
		t.Errorf("m has limit %d; want 3", got)
	}
	resp, err := ts.admin().DeleteOverride(ts.ctx(), &sluicepb.DeleteOverrideRequest{Key: []byte("m")})
	if err != nil || !resp.Existed {
		t.Errorf("DeleteOverride(m) = %v, %v; want existed", resp, err)
	}
	ts.setOverride(&sluicepb.Override{Key: []byte("m"), Limit: 3})
	ts.restart()
	if got := ts.listOverrides("", 0); len(got) != 0 {
		t.Errorf("ListOverrides after a restart in memory mode = %v; want none", got)
	}
}

// TestAdminListOverridesPages: pages cover every override of the prefix
// once, in order, an exact override before the prefix override of the same
// key, also across a page boundary.
func TestAdminListOverridesPages(t *testing.T) {
	ts := newTestServer(t, nil)
	var want []string
	for i := range 12 {
		key := fmt.Sprintf("o:%02d", i)
		ts.setOverride(&sluicepb.Override{Key: []byte(key), Prefix: true, Limit: 1})
		ts.setOverride(&sluicepb.Override{Key: []byte(key), Limit: 1})
		want = append(want, key, key+"*")
	}
	ts.setOverride(&sluicepb.Override{Key: []byte("o"), Limit: 1})
	ts.setOverride(&sluicepb.Override{Key: []byte("p"), Limit: 1})
	for _, size := range []int32{1, 3, 10, 24, 0} {
		if got := overrideNames(ts.listOverrides("o:", size)); !slices.Equal(got, want) {
			t.Errorf("ListOverrides(o:, size %d) = %q; want %q", size, got, want)
		}
	}
	resp, err := ts.admin().ListOverrides(ts.ctx(), &sluicepb.ListOverridesRequest{Prefix: []byte("o:"), PageSize: 10})
	if err != nil || len(resp.Overrides) != 10 || resp.NextPageToken == "" {
		t.Errorf("ListOverrides(o:, size 10) = %v, %v; want 10 overrides and a next page", resp, err)
	}
	all := append([]string{"o"}, want...)
	all = append(all, "p")
	if got := overrideNames(ts.listOverrides("", 5000)); !slices.Equal(got, all) {
		t.Errorf("ListOverrides(all, size 5000) = %q; want %q", got, all)
	}
}

// TestAdminBadInput: every malformed admin call gets InvalidArgument with a
// message, and changes nothing.
func TestAdminBadInput(t *testing.T) {
	ts := newTestServer(t, nil)
	ts.hit(nativeCheck("x", 10, time.Minute, 4))
	before := ts.getKey("x")
	admin := ts.admin()
	ctx := ts.ctx()
	now := ts.clk.Now()
	long := make([]byte, 1025)

	setBad := []struct {
		name string
		o    *sluicepb.Override
	}{
		{"no override", nil},
		{"exact with empty key", &sluicepb.Override{Limit: 5}},
		{"key too long", &sluicepb.Override{Key: long, Limit: 5}},
		{"prefix too long", &sluicepb.Override{Key: long, Prefix: true, Limit: 5}},
		{"negative limit", &sluicepb.Override{Key: []byte("x"), Limit: -1}},
		{"changes nothing", &sluicepb.Override{Key: []byte("x"), Note: "nothing"}},
		{"window too short", &sluicepb.Override{Key: []byte("x"), Window: durationpb.New(time.Microsecond)}},
		{"window too long", &sluicepb.Override{Key: []byte("x"), Window: durationpb.New(4000 * 24 * time.Hour)}},
		{"negative window", &sluicepb.Override{Key: []byte("x"), Window: durationpb.New(-time.Second)}},
		{"invalid window", &sluicepb.Override{Key: []byte("x"), Window: &durationpb.Duration{Seconds: 1, Nanos: -1}}},
		{"unknown algorithm", &sluicepb.Override{Key: []byte("x"), Algorithm: 42}},
		{"expired", &sluicepb.Override{Key: []byte("x"), Limit: 5, ExpiresAt: timestamppb.New(now.Add(-time.Second))}},
		{"expires now", &sluicepb.Override{Key: []byte("x"), Limit: 5, ExpiresAt: timestamppb.New(now)}},
		{"invalid expiry", &sluicepb.Override{Key: []byte("x"), Limit: 5, ExpiresAt: &timestamppb.Timestamp{Seconds: 1 << 62}}},
		{"note too long", &sluicepb.Override{Key: []byte("x"), Limit: 5, Note: strings.Repeat("n", 1025)}},
	}
	for _, tt := range setBad {
		_, err := admin.SetOverride(ctx, &sluicepb.SetOverrideRequest{Override: tt.o})
		wantCode(t, fmt.Sprintf("SetOverride(%s: %v)", tt.name, tt.o), err, codes.InvalidArgument)
	}

	otherToken := encodeToken("a")
	calls := []struct {
		name string
		call func() error
	}{
		{"ListKeys negative page size", func() error {
			_, err := admin.ListKeys(ctx, &sluicepb.ListKeysRequest{PageSize: -1})
			return err
		}},
		{"ListKeys bad page token", func() error {
			_, err := admin.ListKeys(ctx, &sluicepb.ListKeysRequest{PageToken: "not a token!"})
			return err
		}},
		{"ListKeys page token of another prefix", func() error {
			_, err := admin.ListKeys(ctx, &sluicepb.ListKeysRequest{Prefix: []byte("x"), PageToken: otherToken})
			return err
		}},
		{"ListOverrides negative page size", func() error {
			_, err := admin.ListOverrides(ctx, &sluicepb.ListOverridesRequest{PageSize: -5})
			return err
		}},
		{"ListOverrides bad page token", func() error {
			_, err := admin.ListOverrides(ctx, &sluicepb.ListOverridesRequest{PageToken: "%%%"})
			return err
		}},
		{"ListOverrides page token without marker", func() error {
			_, err := admin.ListOverrides(ctx, &sluicepb.ListOverridesRequest{PageToken: otherToken})
			return err
		}},
		{"ListOverrides page token of another prefix", func() error {
			_, err := admin.ListOverrides(ctx, &sluicepb.ListOverridesRequest{Prefix: []byte("x"), PageToken: encodeToken("=a")})
			return err
		}},
		{"GetKey empty key", func() error {
			_, err := admin.GetKey(ctx, &sluicepb.GetKeyRequest{})
			return err
		}},
		{"GetKey key too long", func() error {
			_, err := admin.GetKey(ctx, &sluicepb.GetKeyRequest{Key: long})
			return err
		}},
		{"ResetKey empty key", func() error {
			_, err := admin.ResetKey(ctx, &sluicepb.ResetKeyRequest{})
			return err
		}},
		{"ResetKey key too long", func() error {
			_, err := admin.ResetKey(ctx, &sluicepb.ResetKeyRequest{Key: long})
			return err
		}},
		{"DeleteOverride exact with empty key", func() error {
			_, err := admin.DeleteOverride(ctx, &sluicepb.DeleteOverrideRequest{})
			return err
		}},
		{"EnvoyKey no domain", func() error {
			_, err := admin.EnvoyKey(ctx, &sluicepb.EnvoyKeyRequest{Entries: []*sluicepb.DescriptorEntry{{Key: "a", Value: "b"}}})
			return err
		}},
		{"EnvoyKey no entries", func() error {
			_, err := admin.EnvoyKey(ctx, &sluicepb.EnvoyKeyRequest{Domain: "edge"})
			return err
		}},
	}
	for _, tt := range calls {
		wantCode(t, tt.name, tt.call(), codes.InvalidArgument)
	}

	if got := ts.listOverrides("", 0); len(got) != 0 {
		t.Errorf("ListOverrides after bad calls = %v; want none", got)
	}
	if after := ts.getKey("x"); !proto.Equal(after, before) {
		t.Errorf("GetKey(x) after bad calls = %v; want unchanged %v", after, before)
	}
	if got := ts.limitOf("x"); got != 100 {
		t.Errorf("after bad SetOverride calls, x has limit %d; want 100 as sent", got)
	}
}

// TestAdminToken: with an admin token, admin calls need it; decisions do
// not.
func TestAdminToken(t *testing.T) {
	ts := newTestServer(t, func(c *testConfig) { c.AdminToken = "s3cret" })
	admin := ts.admin()
	get := func(ctx context.Context) error {
		_, err := admin.GetKey(ctx, &sluicepb.GetKeyRequest{Key: []byte("k")})
		return err
	}
	wantCode(t, "GetKey without a token", get(ts.ctx()), codes.Unauthenticated)
	for _, v := range []string{"Bearer wrong", "Bearer s3cret ", "s3cret", "Basic s3cret", "Bearer "} {
		ctx := metadata.AppendToOutgoingContext(ts.ctx(), "authorization", v)
		wantCode(t, fmt.Sprintf("GetKey with authorization %q", v), get(ctx), codes.Unauthenticated)
	}
	_, err := admin.SetOverride(ts.ctx(), &sluicepb.SetOverrideRequest{Override: &sluicepb.Override{Key: []byte("k"), Limit: 1}})
	wantCode(t, "SetOverride without a token", err, codes.Unauthenticated)

	ctx := metadata.AppendToOutgoingContext(ts.ctx(), "authorization", "Bearer s3cret")
	if err := get(ctx); err != nil {
		t.Errorf("GetKey with the right token = %v; want no error", err)
	}
	if d := ts.hit(nativeCheck("k", 10, time.Minute, 1)); !d.Allowed || d.Limit != 10 {
		t.Errorf("Check without a token = %v; want allowed on limit 10 (decisions are open, the unauthenticated override was not set)", d)
	}
}

// TestAdminEnvoyKey: EnvoyKey answers the key the Envoy adapter counts
// under, and a printable form of it.
func TestAdminEnvoyKey(t *testing.T) {
	ts := newTestServer(t, nil)
	req := &sluicepb.EnvoyKeyRequest{Domain: "edge", Entries: []*sluicepb.DescriptorEntry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/a|b"}}}
	resp, err := ts.admin().EnvoyKey(ts.ctx(), req)
	if err != nil {
		t.Fatalf("EnvoyKey(%v) = %v", req, err)
	}
	want := envoyKey("edge", []limits.Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/a|b"}})
	if string(resp.Key) != want || resp.Printable != PrintableKey([]byte(want)) {
		t.Errorf("EnvoyKey(%v) = %q, %q; want %q, %q", req, resp.Key, resp.Printable, want, PrintableKey([]byte(want)))
	}
}

func TestPrintableKey(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"tenant:42 GET /search", "tenant:42 GET /search"},
		{`a\b`, `a\\b`},
		{"\x00\x1f\x7f\xff~", `\x00\x1f\x7f\xff~`},
		{"Zoë", `Zo\xc3\xab`},
	} {
		if got := PrintableKey([]byte(tt.in)); got != tt.want {
			t.Errorf("PrintableKey(%q) = %s; want %s", tt.in, got, tt.want)
		}
	}
}

// TestAdminUnreadableOverrideStopsNode: an override record that cannot be
// decoded stops the node with an error naming it; it is never dropped
// silently.
func TestAdminUnreadableOverrideStopsNode(t *testing.T) {
	for _, tt := range []struct{ name, rk, value string }{
		{"not a message", "=bad", "\xff\xff"},
		{"unknown marker", "?bad", ""},
		{"another key", "=bad", string(mustMarshal(t, &sluicepb.Override{Key: []byte("other"), Limit: 1}))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t, nil)
			if err := ts.store.PutMeta("overrides", tt.rk, []byte(tt.value)); err != nil {
				t.Fatal(err)
			}
			ts.stop()
			store, err := persist.Open(persist.Options{Path: filepath.Join(ts.cfg.DataDir, "sluice.db")})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			if _, err = overrides.Open(overrides.Config{Store: store}); err == nil {
				t.Fatalf("opening the overrides with record %q = %q: no error; want one naming the record", tt.rk, tt.value)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.rk)) {
				t.Errorf("opening the overrides with record %q: %v; want an error naming the record", tt.rk, err)
			}
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
