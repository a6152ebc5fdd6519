package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api"
	"github.com/sluice-io/sluice/scripts/testkit"
)

func TestPrintableKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want string
	}{
		{"user:42", "user:42"},
		{"a b~", "a b~"},
		{`back\slash`, `back\\slash`},
		{"\x00\x1f\x7f\xff", `\x00\x1f\x7f\xff`},
		{"Zoë", `Zo\xc3\xab`},
		{"", ""},
	} {
		if got := api.PrintableKey([]byte(tc.key)); got != tc.want {
			t.Errorf("api.PrintableKey(%q) = %q; want %q", tc.key, got, tc.want)
		}
		if got, err := unescapeKey(tc.want); err != nil || string(got) != tc.key {
			t.Errorf("unescapeKey(%q) = %q, %v; want %q", tc.want, got, err, tc.key)
		}
	}
	if got, err := unescapeKey(`\xAB`); err != nil || string(got) != "\xab" {
		t.Errorf(`unescapeKey("\xAB") = %q, %v; want upper-case hex read too`, got, err)
	}
	for _, bad := range []string{`\`, `a\b`, `\x`, `\x1`, `\xg0`, `\n`} {
		if got, err := unescapeKey(bad); err == nil {
			t.Errorf("unescapeKey(%q) = %q; want an error", bad, got)
		}
	}
}

// FuzzKeyRoundTrip: unescapeKey reads back every key api.PrintableKey
// writes, and what it writes is printable ASCII.
func FuzzKeyRoundTrip(f *testing.F) {
	f.Add([]byte("user:42"))
	f.Add([]byte("\\\x00\xff"))
	f.Fuzz(func(t *testing.T, key []byte) {
		p := api.PrintableKey(key)
		for i := 0; i < len(p); i++ {
			if p[i] < 0x20 || p[i] > 0x7e {
				t.Fatalf("api.PrintableKey(%q) = %q holds byte %#x", key, p, p[i])
			}
		}
		got, err := unescapeKey(p)
		if err != nil || !bytes.Equal(got, key) {
			t.Fatalf("unescapeKey(api.PrintableKey(%q)) = %q, %v", key, got, err)
		}
	})
}

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"1ms", time.Millisecond},
		{"90s", 90 * time.Second},
		{"1h30m", 90 * time.Minute},
		{"7d", 7 * 24 * time.Hour},
		{"365d", 365 * 24 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"-1d2h", -26 * time.Hour},
		{"0", 0},
	} {
		if got, err := parseDuration(tc.in); err != nil || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "d", "1.5d", "1d-2h", "1dd", "soon", "1w", "200000d", "106751d23h59m"} {
		if got, err := parseDuration(bad); err == nil {
			t.Errorf("parseDuration(%q) = %v; want an error", bad, got)
		}
	}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"data-dir":             "SLUICE_DATA_DIR",
		"addr":                 "SLUICE_ADDR",
		"limits-poll-interval": "SLUICE_LIMITS_POLL_INTERVAL",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q; want %q", flag, got, want)
		}
	}
}

// TestWatchSignals: the first signal cancels the context with the signal
// as its cause; the second exits at once with 128+signal.
func TestWatchSignals(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	var stderr testkit.SyncBuffer
	exited := make(chan int, 1)
	ctx, stop := watchSignals(context.Background(), sigs, &stderr, func(code int) { exited <- code })
	defer stop()

	sigs <- syscall.SIGTERM
	<-ctx.Done()
	var se *signalError
	if cause := context.Cause(ctx); !errors.As(cause, &se) || cause.Error() != "received SIGTERM" {
		t.Errorf("cause after SIGTERM = %v; want received SIGTERM", cause)
	}
	select {
	case code := <-exited:
		t.Fatalf("exit(%d) after one signal; want none", code)
	default:
	}
	sigs <- os.Interrupt
	select {
	case code := <-exited:
		if code != 130 {
			t.Errorf("exit code after a second signal, SIGINT = %d; want 130", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after a second signal")
	}
	if got := stderr.String(); !strings.Contains(got, "second SIGINT") {
		t.Errorf("stderr %q; want a line about the second SIGINT", got)
	}
}

// TestWatchSignalsStop: stop ends the watch without a signal.
func TestWatchSignalsStop(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, stop := watchSignals(context.Background(), sigs, &testkit.SyncBuffer{}, func(int) { t.Error("exit called") })
	stop()
	stop()
	if ctx.Err() == nil {
		t.Error("context still live after stop")
	}
}
