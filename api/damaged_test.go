package api

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/apitest"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// TestDamagedRecordOverGRPC: the damaged record, through the
// native API. A batch holding the damaged key is decided but for that
// key, whose decision carries DATA_LOSS quoting it; GetKey answers
// DATA_LOSS; ResetKey clears it, and the key starts empty. Before, the
// whole batch answered INTERNAL, and so did GetKey and ResetKey.
func TestDamagedRecordOverGRPC(t *testing.T) {
	ts := newTestServer(t, nil)
	keys := []string{"dmg:3243", "dmg:3244", "dmg:3245"}
	for _, k := range keys {
		ts.hit(apitest.Check(k, 5, time.Hour, 2))
	}
	ts.stop()
	damageKey(t, ts.cfg.DataDir, "dmg:3244")
	ts.start()

	req := &sluicepb.CheckRequest{}
	for _, k := range keys {
		req.Checks = append(req.Checks, apitest.Check(k, 5, time.Hour, 1))
	}
	resp, err := sluicepb.NewRateLimitServiceClient(ts.conn).Check(ts.ctx(), req)
	if err != nil {
		t.Fatalf("Check(%v) = %v; want the batch decided but for the damaged key", keys, err)
	}
	for i, d := range resp.Decisions {
		if keys[i] == "dmg:3244" {
			if codes.Code(d.ErrorCode) != codes.DataLoss || !strings.Contains(d.ErrorMessage, `"dmg:3244"`) || d.Allowed {
				t.Errorf("decision of the damaged key = %v; want error_code DATA_LOSS, a message quoting the key, not allowed", d)
			}
			continue
		}
		if d.ErrorCode != 0 || !d.Allowed || d.Remaining != 2 {
			t.Errorf("decision of %q = %v; want allowed, remaining 2", keys[i], d)
		}
	}
	_, err = ts.admin().GetKey(ts.ctx(), &sluicepb.GetKeyRequest{Key: []byte("dmg:3244")})
	wantCode(t, "GetKey(damaged key)", err, codes.DataLoss)
	if err != nil && !strings.Contains(err.Error(), `"dmg:3244"`) {
		t.Errorf("GetKey(damaged key) = %v; want the key quoted", err)
	}
	if _, err := ts.admin().ResetKey(ts.ctx(), &sluicepb.ResetKeyRequest{Key: []byte("dmg:3244")}); err != nil {
		t.Fatalf("ResetKey(damaged key) = %v; want it cleared", err)
	}
	if d := ts.hit(apitest.Check("dmg:3244", 5, time.Hour, 1)); d.ErrorCode != 0 || !d.Allowed || d.Remaining != 4 {
		t.Errorf("after ResetKey: %s", fmt.Sprint(d))
	}
}

// damageKey gives key's record in the stopped server's data file in dir a
// state that does not decode (version 65), keeping its deadline.
func damageKey(t *testing.T, dir, key string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "sluice.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys"))
		v := b.Get([]byte(key))
		if len(v) < 8 {
			return fmt.Errorf("no record of %q", key)
		}
		return b.Put([]byte(key), append(v[:8:8], 65, 1, 0))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestDamagedRecordOverEnvoy: Envoy has no per-descriptor error, so a
// request holding a damaged key fails with DATA_LOSS quoting it (Envoy
// applies its failure mode), and its other descriptors are decided.
func TestDamagedRecordOverEnvoy(t *testing.T) {
	ts := newTestServer(t, nil)
	ec := newEnvoyClient(ts)
	good := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("user", "good"), 5, typev3.RateLimitUnit_HOUR, 0)
	}
	bad := func() *ratelimitv3.RateLimitDescriptor {
		return inline(rd("user", "bad"), 5, typev3.RateLimitUnit_HOUR, 0)
	}
	ec.call("edge", 1, good(), bad())
	k, err := ts.admin().EnvoyKey(ts.ctx(), &sluicepb.EnvoyKeyRequest{Domain: "edge", Entries: []*sluicepb.DescriptorEntry{{Key: "user", Value: "bad"}}})
	if err != nil {
		t.Fatal(err)
	}
	ts.stop()
	damageKey(t, ts.cfg.DataDir, string(k.Key))
	ts.start()
	ec = newEnvoyClient(ts)
	_, err = ec.try(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), bad()}, HitsAddend: 1})
	if status.Code(err) != codes.DataLoss || !strings.Contains(err.Error(), `"edge`) {
		t.Fatalf("ShouldRateLimit(good, damaged) = %v; want DATA_LOSS quoting the key", err)
	}
	resp := ec.call("edge", 1, good())
	if got := resp.Statuses[0].LimitRemaining; got != 2 {
		t.Errorf("the good descriptor has %d remaining; want 2 (its hit in the failed request was decided)", got)
	}
}
