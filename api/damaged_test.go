package api

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"

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
	db, err := bolt.Open(filepath.Join(ts.cfg.DataDir, "sluice.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys"))
		v := b.Get([]byte("dmg:3244"))
		// The deadline stays; the state's version byte becomes 65.
		return b.Put([]byte("dmg:3244"), append(v[:8:8], 65, 1, 0))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
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
