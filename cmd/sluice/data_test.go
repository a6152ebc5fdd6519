package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestDamagedRecordEndToEnd: the damaged record through the
// binary's commands. data verify lists it without changing the file; a
// node started on the file answers DATA_LOSS for that key only, counts it
// in sluice_damaged_records_total; key reset clears it, and data verify
// then finds nothing.
func TestDamagedRecordEndToEnd(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	for _, k := range []string{"dmg:1", "dmg:3244", "dmg:3"} {
		mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, k, "--limit", "10", "--window", "1h")
	}
	n.stop()
	dir := n.dataDir
	r := mustRun(t, exitOK, nil, "data", "verify", dir)
	if !strings.Contains(r.stdout, "3 records read, 0 damaged pages, 0 damaged records") {
		t.Errorf("data verify (clean file): %v", r)
	}

	path := filepath.Join(dir, "sluice.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys"))
		return b.Put([]byte("dmg:3244"), append(b.Get([]byte("dmg:3244"))[:8:8], 'A', 1))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, exitError, nil, "data", "verify", dir)
	if want := `damaged record: key "dmg:3244": actor: decode state: segment 0: unknown encoding version 65`; !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "3 records read, 0 damaged pages, 1 damaged records") {
		t.Errorf("data verify (damaged record): %v\nwant it to list %q", r, want)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Errorf("data verify modified the data file")
	}

	n = startNode(t, nil, "--data-dir", dir)
	r = mustRun(t, exitError, nil, "check", "--addr", n.grpcAddr, "dmg:3244", "--limit", "10", "--window", "1h")
	if !strings.Contains(r.stderr, "DataLoss") || !strings.Contains(r.stderr, `"dmg:3244"`) {
		t.Errorf("check on the damaged key: %v; want DataLoss naming the key", r)
	}
	mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "dmg:3", "--limit", "10", "--window", "1h")
	r = mustRun(t, exitError, nil, "key", "get", "dmg:3244", "--addr", n.grpcAddr)
	if !strings.Contains(r.stderr, "DataLoss") {
		t.Errorf("key get on the damaged key: %v; want DataLoss", r)
	}
	resp, err := http.Get("http://" + n.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "\nsluice_damaged_records_total 1\n") {
		t.Errorf("/metrics lacks sluice_damaged_records_total 1:\n%s", metrics)
	}
	mustRun(t, exitOK, nil, "key", "reset", "dmg:3244", "--addr", n.grpcAddr)
	mustRun(t, exitOK, nil, "check", "--addr", n.grpcAddr, "dmg:3244", "--limit", "10", "--window", "1h")
	n.stop()
	r = mustRun(t, exitOK, nil, "data", "verify", dir)
	if !strings.Contains(r.stdout, "0 damaged records") {
		t.Errorf("data verify after key reset: %v", r)
	}
}
