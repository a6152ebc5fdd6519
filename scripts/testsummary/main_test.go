package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSummarizeGoTest runs go test -json on a module of four packages (one
// passing with skips, one failing, one without tests, one that does not
// build) and checks the summary: a line per package as go test prints it,
// the failed tests' output in full and nothing of the tests that passed,
// the build error, one line per skipped suite with its reason, and a
// failed status.
func TestSummarizeGoTest(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/m\n\ngo 1.22\n",
		"good/good_test.go": `package good

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet when passing") }

func TestNeedsRoot(t *testing.T) { t.Log("probing"); t.Skip("needs root to create network namespaces") }

func TestAlsoNeedsRoot(t *testing.T) { t.Skip("needs root to create network namespaces") }

func TestTable(t *testing.T) {
	t.Run("browser", func(t *testing.T) { t.Skipf("no %s", "Chromium") })
}
`,
		"bad/bad_test.go": `package bad

import "testing"

func TestFine(t *testing.T) { t.Log("quiet when passing") }

func TestBroken(t *testing.T) {
	t.Log("context for the failure")
	t.Run("sub", func(t *testing.T) { t.Errorf("Check(%q) = %v; want %v", "k", 2, 1) })
}
`,
		"none/none.go":     "package none\n",
		"broken/broken.go": "package broken\n\nfunc f() int { return \"x\" }\n",
		"broken/b_test.go": "package broken\n\nimport \"testing\"\n\nfunc TestX(t *testing.T) {}\n",
	}
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"test", "-json"}
	if raceEnabled { // reuse the standard library as the tests compiled it
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./...")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	events, err := cmd.Output()
	if len(events) == 0 {
		t.Fatalf("go test -json: no output (%v)", err)
	}
	var out bytes.Buffer
	ok := summarize(bytes.NewReader(events), &out)
	got := out.String()
	t.Logf("summary:\n%s", got)
	if ok {
		t.Error("summarize = true; want false (a package failed)")
	}
	for _, want := range []string{
		"ok  \texample.com/m/good\t",
		"?   \texample.com/m/none\t[no test files]",
		"--- FAIL: TestBroken",
		"context for the failure",
		`Check("k") = 2; want 1`,
		"FAIL\texample.com/m/bad\t",
		"cannot use \"x\"",
		"FAIL\texample.com/m/broken [build failed]",
		"skipped (3 tests; go test -v shows each skip as it happens):\n",
		"  good TestNeedsRoot and 1 more: needs root to create network namespaces\n",
		"  good TestTable/browser: no Chromium\n",
		"FAIL: 2 of 4 packages failed (",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	for _, unwanted := range []string{"quiet when passing", "=== RUN", "probing"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("summary has %q; want it left out", unwanted)
		}
	}
}

// TestSummarizeIncomplete: a run cut short (a package that started and
// never finished) and an empty input both fail; lines that are not JSON
// pass through.
func TestSummarizeIncomplete(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		want     []string
	}{
		{"cut", `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestLong"}
{"Action":"output","Package":"p","Test":"TestLong","Output":"    long_test.go:9: still going\n"}
not json
`, []string{"not json\n", "still going", "FAIL\tp\t(no result: go test stopped before the package finished)", "FAIL: 1 of 1 package failed (p)"}},
		{"empty", "", []string{"no test results on stdin"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if summarize(strings.NewReader(tt.in), &out) {
				t.Errorf("summarize(%q) = true; want false", tt.in)
			}
			for _, want := range tt.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("summarize(%q) printed\n%s\nwant it to include %q", tt.in, out.String(), want)
				}
			}
		})
	}
}

// TestSummarizePass: a run where everything passed succeeds and says so.
func TestSummarizePass(t *testing.T) {
	in := `{"Time":"2026-01-01T00:00:00Z","Action":"start","Package":"p"}
{"Time":"2026-01-01T00:00:01Z","Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}
{"Time":"2026-01-01T00:00:01Z","Action":"output","Package":"p","Output":"ok  \tp\t0.600s\n"}
{"Time":"2026-01-01T00:01:05Z","Action":"pass","Package":"p","Elapsed":0.6}
`
	var out bytes.Buffer
	if !summarize(strings.NewReader(in), &out) {
		t.Errorf("summarize = false; want true\n%s", out.String())
	}
	if want := "ok  \tp\t0.600s\nok: 1 package passed; tests: 1 passed, 0 skipped, in 1m5s\n"; out.String() != want {
		t.Errorf("summarize printed\n%q\nwant\n%q", out.String(), want)
	}
}

func TestSummarizeNamesSlowTests(t *testing.T) {
	in := `{"Time":"2026-01-01T00:00:00Z","Action":"start","Package":"m/a"}
{"Time":"2026-01-01T00:00:00Z","Action":"start","Package":"m/b"}
{"Time":"2026-01-01T00:00:01Z","Action":"pass","Package":"m/a","Test":"TestQuick","Elapsed":9.9}
{"Time":"2026-01-01T00:00:01Z","Action":"pass","Package":"m/a","Test":"TestSlow/part","Elapsed":30}
{"Time":"2026-01-01T00:00:01Z","Action":"pass","Package":"m/a","Test":"TestSlow","Elapsed":31}
{"Time":"2026-01-01T00:00:01Z","Action":"fail","Package":"m/b","Test":"TestSlower","Elapsed":45.2}
{"Time":"2026-01-01T00:00:01Z","Action":"pass","Package":"m/a","Elapsed":41}
{"Time":"2026-01-01T00:00:02Z","Action":"fail","Package":"m/b","Elapsed":46}
`
	var out bytes.Buffer
	summarize(strings.NewReader(in), &out)
	if want := "slowest tests (10 s or more; parallel tests overlap): b TestSlower 45s, a TestSlow 31s\n"; !strings.Contains(out.String(), want) {
		t.Errorf("summarize printed\n%s\nwant a line\n%s", out.String(), want)
	}
}
