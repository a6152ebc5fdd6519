package persist

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
)

// scanMeta returns every record of a meta bucket.
func scanMeta(t testing.TB, s *Store, bucket string) map[string]string {
	t.Helper()
	got := make(map[string]string)
	var order []string
	err := s.ScanMeta(bucket, func(key string, value []byte) bool {
		got[key] = string(value)
		order = append(order, key)
		return true
	})
	if err != nil {
		t.Fatalf("ScanMeta(%q) = %v; want nil", bucket, err)
	}
	for i := 1; i < len(order); i++ {
		if order[i-1] >= order[i] {
			t.Fatalf("ScanMeta(%q) visited %q then %q; want ascending key order", bucket, order[i-1], order[i])
		}
	}
	return got
}

// TestMeta: meta records are put, replaced, scanned in key order and
// deleted, each bucket on its own and apart from key state.
func TestMeta(t *testing.T) {
	for _, mode := range []Mode{ModeCommit, ModeFsync, ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			o := testOptions(t)
			o.Mode = mode
			s := openStore(t, o)
			if got := scanMeta(t, s, "overrides"); len(got) != 0 {
				t.Fatalf("ScanMeta of a new file = %v; want nothing", got)
			}
			submit(t, s, put("=a", 10, "state"))
			for _, kv := range [][2]string{{"=b", "2"}, {"=a", "1"}, {"*a", "p"}, {"=b", "two"}} {
				if err := s.PutMeta("overrides", kv[0], []byte(kv[1])); err != nil {
					t.Fatalf("PutMeta(overrides, %q) = %v; want nil", kv[0], err)
				}
			}
			if err := s.PutMeta("other", "=a", nil); err != nil {
				t.Fatalf("PutMeta(other, =a, nil) = %v; want nil", err)
			}
			want := map[string]string{"*a": "p", "=a": "1", "=b": "two"}
			if got := scanMeta(t, s, "overrides"); !maps.Equal(got, want) {
				t.Errorf("ScanMeta(overrides) = %v; want %v", got, want)
			}
			if got, want := scanMeta(t, s, "other"), map[string]string{"=a": ""}; !maps.Equal(got, want) {
				t.Errorf("ScanMeta(other) = %v; want %v", got, want)
			}
			if got, want := dump(t, s), map[string]stored{"=a": {10, "state"}}; !maps.Equal(got, want) {
				t.Errorf("key state = %v; want %v, untouched by meta records", got, want)
			}

			existed, err := s.DeleteMeta("overrides", "=a")
			if err != nil || !existed {
				t.Errorf("DeleteMeta(overrides, =a) = %t, %v; want true, nil", existed, err)
			}
			existed, err = s.DeleteMeta("overrides", "=a")
			if err != nil || existed {
				t.Errorf("second DeleteMeta(overrides, =a) = %t, %v; want false, nil", existed, err)
			}
			existed, err = s.DeleteMeta("never", "=a")
			if err != nil || existed {
				t.Errorf("DeleteMeta(never, =a) = %t, %v; want false, nil", existed, err)
			}
			want = map[string]string{"*a": "p", "=b": "two"}
			if got := scanMeta(t, s, "overrides"); !maps.Equal(got, want) {
				t.Errorf("ScanMeta(overrides) after delete = %v; want %v", got, want)
			}

			// fn returning false stops the scan.
			n := 0
			if err := s.ScanMeta("overrides", func(string, []byte) bool { n++; return false }); err != nil || n != 1 {
				t.Errorf("ScanMeta stopping at once: %d calls, %v; want 1 call, nil", n, err)
			}
		})
	}
}

// TestMetaSurvivesReopen: a meta record is on disk when PutMeta returns.
func TestMetaSurvivesReopen(t *testing.T) {
	o := testOptions(t)
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := s.PutMeta("overrides", fmt.Sprintf("k%d", i), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DeleteMeta("overrides", "k2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, o)
	want := map[string]string{"k0": "\x00", "k1": "\x01", "k3": "\x03", "k4": "\x04"}
	if got := scanMeta(t, s, "overrides"); !maps.Equal(got, want) {
		t.Errorf("ScanMeta after reopen = %q; want %q", got, want)
	}
}

// TestMetaBadInput: empty names and oversized keys are refused and change
// nothing.
func TestMetaBadInput(t *testing.T) {
	s := openStore(t, testOptions(t))
	long := strings.Repeat("k", MaxMetaKeyLen+1)
	for _, tt := range []struct{ bucket, key string }{{"", "k"}, {"b", ""}, {"b", long}} {
		if err := s.PutMeta(tt.bucket, tt.key, []byte("v")); err == nil || !strings.HasPrefix(err.Error(), "persist: ") {
			t.Errorf("PutMeta(%q, %d-byte key) = %v; want a persist error", tt.bucket, len(tt.key), err)
		}
		if _, err := s.DeleteMeta(tt.bucket, tt.key); err == nil {
			t.Errorf("DeleteMeta(%q, %d-byte key) = nil; want an error", tt.bucket, len(tt.key))
		}
	}
	if err := s.ScanMeta("", func(string, []byte) bool { return true }); err == nil {
		t.Errorf("ScanMeta(\"\") = nil; want an error")
	}
	if got := scanMeta(t, s, "b"); len(got) != 0 {
		t.Errorf("ScanMeta(b) = %v; want nothing", got)
	}
}

// TestMetaClosed: after Close every meta method fails with ErrClosed.
func TestMetaClosed(t *testing.T) {
	s, err := Open(testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutMeta("overrides", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMeta("overrides", "k", []byte("v")); !errors.Is(err, ErrClosed) {
		t.Errorf("PutMeta after Close = %v; want ErrClosed", err)
	}
	if _, err := s.DeleteMeta("overrides", "k"); !errors.Is(err, ErrClosed) {
		t.Errorf("DeleteMeta after Close = %v; want ErrClosed", err)
	}
	if err := s.ScanMeta("overrides", func(string, []byte) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Errorf("ScanMeta after Close = %v; want ErrClosed", err)
	}
}
