package actor

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// logFile is a log destination in t.TempDir() and a function that reads
// what was logged so far.
func logFile(t *testing.T) (*slog.Logger, func() string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return slog.New(slog.NewTextHandler(f, nil)), func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// damageRecord overwrites key's stored value in the closed data file of
// dir with bytes no state decodes from (version 65, as the flipped
// record read), keeping its deadline.
func damageRecord(t *testing.T, dir, key string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "sluice.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keys"))
		v := b.Get([]byte(key))
		if len(v) < 8 {
			t.Fatalf("key %q is not in the data file", key)
		}
		bad := binary.BigEndian.AppendUint64(nil, binary.BigEndian.Uint64(v))
		return b.Put([]byte(key), append(bad, 'A', 'A', 'A', 'A'))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDamagedRecordCostsOneKey: a key whose stored state cannot be decoded
// costs that key only. In a call with other keys, its check carries a
// *DamagedError naming it and the others are decided (with their stored
// hits); the damage is logged and counted once however often the key is
// asked for; Inspect answers the same error; Reset clears it, and the key
// starts empty. Before, the whole call failed, each time, and nothing was
// logged.
func TestDamagedRecordCostsOneKey(t *testing.T) {
	logger, logs := logFile(t)
	h := newHarness(t, "commit", func(c *Config) { c.Logger = logger })
	keys := []string{"dmg:1", "dmg:3244", "dmg:3"}
	for _, k := range keys {
		h.hit(k, 10, 3)
	}
	h.stop()
	damageRecord(t, h.dir, "dmg:3244")
	h.start()

	checks := make([]Check, len(keys))
	for i, k := range keys {
		checks[i] = Check{Key: k, Limit: 10, Window: time.Minute, Cost: 1}
	}
	for round := range 3 {
		out := make([]Decision, len(checks))
		if err := h.eng.Check(context.Background(), checks, out); err != nil {
			t.Fatalf("round %d: Check(%v) = %v; want the other keys decided", round, keys, err)
		}
		for i, d := range out {
			if keys[i] == "dmg:3244" {
				var de *DamagedError
				if !errors.As(d.Err, &de) || !errors.Is(d.Err, ErrDamaged) || de.Key != "dmg:3244" || d.Allowed {
					t.Fatalf("round %d: decision of the damaged key = %+v; want a *DamagedError naming it, not allowed", round, d)
				}
				if !strings.Contains(d.Err.Error(), `"dmg:3244"`) {
					t.Errorf("error %q does not quote the key", d.Err)
				}
				continue
			}
			if want := int64(10 - 3 - 1 - round); d.Err != nil || !d.Allowed || d.Remaining != want {
				t.Errorf("round %d: Check(%q) = %+v; want allowed, remaining %d (its stored hits count)", round, keys[i], d, want)
			}
		}
	}
	if _, err := h.eng.Inspect(context.Background(), "dmg:3244"); !errors.Is(err, ErrDamaged) {
		t.Errorf("Inspect(damaged key) = %v; want ErrDamaged", err)
	}
	if got := h.obs.damaged.Load(); got != 1 {
		t.Errorf("damaged records counted %d times; want 1", got)
	}
	if n := strings.Count(logs(), "damaged record"); n != 1 {
		t.Errorf("damage logged %d times; want once. Log:\n%s", n, logs())
	}
	if !strings.Contains(logs(), `key="\"dmg:3244\""`) {
		t.Errorf("log does not name the key:\n%s", logs())
	}

	existed, err := h.eng.Reset(context.Background(), "dmg:3244")
	if err != nil || !existed {
		t.Fatalf("Reset(damaged key) = %v, %v; want true, nil", existed, err)
	}
	if d := h.hit("dmg:3244", 10, 1); d.Err != nil || !d.Allowed || d.Remaining != 9 {
		t.Errorf("after Reset: Check = %+v; want allowed, remaining 9", d)
	}
	h.restart() // the reset and the new hit are on disk, the damage gone
	if d := h.hit("dmg:3244", 10, 1); d.Err != nil || !d.Allowed || d.Remaining != 8 {
		t.Errorf("after Reset and a restart: Check = %+v; want allowed, remaining 8", d)
	}
}
