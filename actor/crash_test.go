package actor

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-io/sluice/actor/clock"
	"github.com/sluice-io/sluice/persist"
)

const crashEnv = "SLUICE_TEST_CRASH_CHILD"

func crashChildDir() string { return os.Getenv(crashEnv) }

// crashKeys is how many keys each call of the crash child hits.
const crashKeys = 10

// runCrashChild is the child process of TestCrashKeepsAcknowledgedHits: it
// hits crashKeys keys per call in the default durability mode and prints a
// line after each acknowledged call, until it is killed.
func runCrashChild(dir string) {
	store, err := persist.Open(persist.Options{Path: filepath.Join(dir, "sluice.db")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	eng, err := New(Config{Store: store, Clock: clock.NewFake(epoch)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	checks := make([]Check, crashKeys)
	for i := range checks {
		checks[i] = Check{Key: fmt.Sprintf("crash-%d", i), Limit: 1_000_000, Window: time.Hour, Cost: 1}
	}
	out := make([]Decision, crashKeys)
	deadline := time.Now().Add(time.Minute) // never outlive a parent that failed to kill us
	for time.Now().Before(deadline) {
		if err := eng.Check(context.Background(), checks, out); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Stdout.WriteString("ack\n")
	}
	os.Exit(3)
}

// TestCrashKeepsAcknowledgedHits: kill -9 in the default durability mode
// loses no acknowledged hit, so a restart hands out no free window.
func TestCrashKeepsAcknowledgedHits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := 0
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if acked++; acked == 300 {
			if err := cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
		}
	}
	cmd.Wait()
	if acked < 300 {
		t.Fatalf("child acknowledged %d calls before it died; want at least 300", acked)
	}

	store, err := persist.Open(persist.Options{Path: filepath.Join(dir, "sluice.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	eng, err := New(Config{Store: store, Clock: clock.NewFake(epoch)})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for i := 0; i < crashKeys; i++ {
		var d [1]Decision
		c := Check{Key: fmt.Sprintf("crash-%d", i), Limit: 1_000_000, Window: time.Hour}
		if err := eng.Check(context.Background(), []Check{c}, d[:]); err != nil {
			t.Fatal(err)
		}
		if used := c.Limit - d[0].Remaining; used < int64(acked) {
			t.Errorf("after kill -9, %s has %d hits; the child was told %d were recorded", c.Key, used, acked)
		} else {
			t.Logf("%s: %d acknowledged, %d on disk", c.Key, acked, used)
		}
	}
}
