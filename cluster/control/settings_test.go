package control

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestSettingsString: the settings go through gossip as a string and come
// back whole. Without partitions the string is the one nodes of earlier
// versions write and parse.
func TestSettingsString(t *testing.T) {
	for _, tt := range []struct {
		s    Settings
		want string
	}{
		{Settings{Replicas: 2, Policy: "exact", Lease: 2 * time.Second}, "r2,exact,2000ms"},
		{Settings{Replicas: 1, Policy: "available", Lease: 500 * time.Millisecond}, "r1,available,500ms"},
		{Settings{Replicas: 2, Policy: "exact", Lease: 2 * time.Second, Partitions: 64, MinInsync: 1}, "r2,exact,2000ms,p64,i1"},
		{Settings{Replicas: 3, Policy: "available", Lease: time.Second, Partitions: 1, MinInsync: 2}, "r3,available,1000ms,p1,i2"},
	} {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("%+v.String() = %q; want %q", tt.s, got, tt.want)
		}
		back, err := ParseSettings(tt.want)
		if err != nil || back != tt.s {
			t.Errorf("ParseSettings(%q) = %+v, %v; want %+v", tt.want, back, err, tt.s)
		}
	}
}

// TestParseSettingsRefuses: a string String does not write is refused,
// with an error that says which part is wrong.
func TestParseSettingsRefuses(t *testing.T) {
	for _, tt := range []struct{ str, want string }{
		{"r2,exact", "want r<replicas>"},
		{"r2,exact,2000ms,p8", "want r<replicas>"},
		{"r2,exact,2000ms,p8,i1,x", "want r<replicas>"},
		{"x2,exact,2000ms", "replicas"},
		{"r2,exact,soon", "lease"},
		{"r2,exact,2000ms,p0,i1", "partitions"},
		{"r2,exact,2000ms,8,i1", "partitions"},
		{"r2,exact,2000ms,p-8,i1", "partitions"},
		{"r2,exact,2000ms,p+8,i1", "partitions"},
		{"r2,exact,2000ms,p8x,i1", "partitions"},
		{"r2,exact,2000ms,p8,i", "min-insync"},
		{"r2,exact,2000ms,p8,i0", "min-insync"},
		{"r2,exact,2000ms,p8,1", "min-insync"},
	} {
		s, err := ParseSettings(tt.str)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseSettings(%q) = %+v, %v; want an error naming %q", tt.str, s, err, tt.want)
		}
	}
}

// TestSettingsMismatch: a node whose partition settings differ from the
// cluster's is told which flag to fix.
func TestSettingsMismatch(t *testing.T) {
	cluster := Settings{Replicas: 2, Policy: "exact", Lease: 2 * time.Second, Partitions: 16, MinInsync: 1}
	for _, tt := range []struct {
		name string
		node func(*Settings)
		want string
	}{
		{"same", func(*Settings) {}, ""},
		{"other partitions", func(s *Settings) { s.Partitions = 32 }, "--partitions 32, but the cluster runs with --partitions 16"},
		{"no partitions", func(s *Settings) { s.Partitions, s.MinInsync = 0, 0 }, "--partitions 0, but the cluster runs with --partitions 16"},
		{"replicas named first", func(s *Settings) { s.Replicas, s.MinInsync = 3, 2 }, "--replicas 3, but the cluster runs with --replicas 2"},
		{"only min-insync", func(s *Settings) { s.MinInsync = 2 }, "--min-insync 2, but the cluster runs with --min-insync 1"},
	} {
		node := cluster
		tt.node(&node)
		if got := cluster.Mismatch(node); got != tt.want {
			t.Errorf("%s: Mismatch(%+v) = %q; want %q", tt.name, node, got, tt.want)
		}
	}
	old := Settings{Replicas: 2, Policy: "exact", Lease: 2 * time.Second}
	if got := old.Mismatch(cluster); !strings.Contains(got, "--partitions 16, but the cluster runs with --partitions 0") {
		t.Errorf("a cluster without partitions, a node with 16: Mismatch = %q", got)
	}
}

// TestSettingsValidate: partitions are 0 or a power of two; with them
// min-insync defaults to 1 and runs from 1 to the replicas, except 2 of
// 2, which a restart of one node would turn into refused writes.
func TestSettingsValidate(t *testing.T) {
	for _, tt := range []struct {
		name          string
		s             Settings
		want          string // a part of the error; "" for none
		wantMinInsync int
	}{
		{"no partitions", Settings{Replicas: 2}, "", 0},
		{"partitions, default min-insync", Settings{Replicas: 2, Partitions: 8}, "", 1},
		{"one partition", Settings{Replicas: 1, Partitions: 1}, "", 1},
		{"three replicas, two in sync", Settings{Replicas: 3, Partitions: 256, MinInsync: 2}, "", 2},
		{"three of three", Settings{Replicas: 3, Partitions: 256, MinInsync: 3}, "", 3},
		{"not a power of two", Settings{Replicas: 2, Partitions: 6}, "--partitions 6: want 0 (none) or a power of two", 0},
		{"too many", Settings{Replicas: 2, Partitions: 1 << 17}, "--partitions 131072", 0},
		{"negative", Settings{Replicas: 2, Partitions: -4}, "--partitions -4", 0},
		{"more in sync than replicas", Settings{Replicas: 2, Partitions: 8, MinInsync: 3}, "--min-insync 3 with --replicas 2: want 1 to 2", 0},
		{"more in sync than one replica", Settings{Partitions: 8, MinInsync: 2}, "--min-insync 2 with --replicas 1: want 1 to 1", 0},
		{"two of two", Settings{Replicas: 2, Partitions: 8, MinInsync: 2}, "a restart of one node would refuse writes", 0},
		{"min-insync without partitions", Settings{Replicas: 2, MinInsync: 1}, "--min-insync 1 without --partitions", 0},
		{"unknown policy", Settings{Replicas: 2, Policy: "strict"}, "--owner-policy \"strict\"", 0},
	} {
		s := Config{Settings: tt.s}.withDefaults().Settings
		err := s.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Validate(%+v) = %v; want nil", tt.name, s, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: Validate(%+v) = %v; want an error naming %q", tt.name, s, err, tt.want)
		case tt.want == "" && s.MinInsync != tt.wantMinInsync:
			t.Errorf("%s: min-insync after defaults = %d; want %d", tt.name, s.MinInsync, tt.wantMinInsync)
		}
	}
	// Every bad setting at once.
	err := Settings{Policy: "strict", Partitions: 6}.Validate()
	if err == nil || !strings.Contains(err.Error(), "strict") || !strings.Contains(err.Error(), "--partitions 6") {
		t.Errorf("Validate of two bad settings = %v; want both named", err)
	}
}

// TestNewRefusesSettings: New refuses settings that are not valid before
// it opens anything.
func TestNewRefusesSettings(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	cfg := Config{NodeName: "n1", DataDir: t.TempDir(), Gossip: &soloGossip{}, Settings: Settings{Replicas: 2, Partitions: 8, MinInsync: 2},
		Transport: TransportConfig{Listener: lis, Advertise: lis.Addr().String()}}
	c, err := New(cfg)
	if err == nil {
		c.Shutdown()
		t.Fatalf("New with --replicas 2 --min-insync 2 succeeded")
	}
	if !strings.Contains(err.Error(), "--min-insync 2") {
		t.Fatalf("New with --replicas 2 --min-insync 2 = %v; want an error naming the setting", err)
	}
}
