package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	if !summarize(os.Stdin, os.Stdout) {
		os.Exit(1)
	}
}

// event is one line of go test -json (see go doc test2json).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	Test       string
	Elapsed    float64 // seconds
	Output     string
	ImportPath string // of build-output and build-fail events
}

// output is one output event of a package.
type output struct {
	test string // "" for the package's own output
	text string
}

// pkg is what a package sent so far.
type pkg struct {
	outputs []output
	ended   map[string]string // test → pass, fail or skip
	last    map[string]string // test → the last line it logged
}

// timed is a top-level test that ended, and how long it took.
type timed struct {
	pkg, test string
	elapsed   float64 // seconds
}

// slowAfter is how long a top-level test runs before the summary names
// it among the slowest, and slowest how many it names: where a run's time
// goes, for whoever keeps CI short.
const (
	slowAfter = 10.0
	slowest   = 8
)

// skip is a skipped test and its reason.
type skip struct {
	pkg, test, reason string
}

// summarize reads go test -json events from r, writes the summary to w and
// reports whether every package passed.
func summarize(r io.Reader, w io.Writer) bool {
	s := &summary{w: w, pkgs: map[string]*pkg{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if line := sc.Bytes(); len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		s.add(&e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(w, "testsummary: reading go test's output: %v\n", err)
		s.failed = append(s.failed, "(input)")
	}
	return s.end()
}

// summary is the state of a run.
type summary struct {
	w           io.Writer
	pkgs        map[string]*pkg // packages not finished yet
	seen        []string        // every package, in the order they started
	passed      int
	failed      []string // packages
	tests       struct{ pass, fail, skip int }
	skips       []skip
	slow        []timed // top-level tests that took slowAfter or longer
	first, last time.Time
}

func (s *summary) add(e *event) {
	if !e.Time.IsZero() {
		if s.first.IsZero() {
			s.first = e.Time
		}
		s.last = e.Time
	}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output) // compiler and vet errors, as go test prints them
		return
	case "build-fail":
		return
	}
	if e.Package == "" {
		return
	}
	p := s.pkgs[e.Package]
	if p == nil {
		p = &pkg{ended: map[string]string{}, last: map[string]string{}}
		s.pkgs[e.Package] = p
		s.seen = append(s.seen, e.Package)
	}
	switch e.Action {
	case "output":
		p.outputs = append(p.outputs, output{e.Test, e.Output})
		if e.Test != "" && !framing(e.Output) && !strings.HasPrefix(strings.TrimSpace(e.Output), "--- ") {
			p.last[e.Test] = e.Output
		}
	case "pass", "fail", "skip":
		if e.Test != "" {
			p.ended[e.Test] = e.Action
			if e.Action != "skip" && e.Elapsed >= slowAfter && !strings.Contains(e.Test, "/") {
				s.slow = append(s.slow, timed{e.Package, e.Test, e.Elapsed})
			}
			switch e.Action {
			case "pass":
				s.tests.pass++
			case "fail":
				s.tests.fail++
			case "skip":
				s.tests.skip++
				s.skips = append(s.skips, skip{e.Package, e.Test, reason(p.last[e.Test])})
			}
			return
		}
		s.finish(e.Package, p, e.Action, e.Elapsed)
	}
}

// finish prints the result of a package that ended with action (pass,
// fail or skip).
func (s *summary) finish(name string, p *pkg, action string, elapsed float64) {
	delete(s.pkgs, name)
	switch action {
	case "pass", "skip":
		s.passed++
		printed := false
		for _, o := range p.outputs {
			if o.test == "" && (strings.HasPrefix(o.text, "ok ") || strings.HasPrefix(o.text, "? ")) {
				fmt.Fprint(s.w, o.text)
				printed = true
			}
		}
		if !printed {
			fmt.Fprintf(s.w, "ok  \t%s\t%.3fs\n", name, elapsed)
		}
	default:
		s.failed = append(s.failed, name)
		s.printFailure(p)
	}
}

// printFailure prints the output of a failed package as go test does: the
// package's own output and that of every test that failed or never
// finished (a panic, a timeout), without the lines that only frame the
// output of go test -v.
func (s *summary) printFailure(p *pkg) {
	for _, o := range p.outputs {
		if framing(o.text) {
			continue
		}
		if end := p.ended[o.test]; o.test == "" || end == "fail" || end == "" {
			fmt.Fprint(s.w, o.text)
		}
	}
}

// end prints what never finished, the skipped suites and the total, and
// reports whether everything passed.
func (s *summary) end() bool {
	names := make([]string, 0, len(s.pkgs))
	for name := range s.pkgs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		s.printFailure(s.pkgs[name])
		fmt.Fprintf(s.w, "FAIL\t%s\t(no result: go test stopped before the package finished)\n", name)
		s.failed = append(s.failed, name)
	}
	s.printSkips()
	s.printSlow()
	took := s.last.Sub(s.first).Round(time.Second)
	switch {
	case len(s.seen) == 0:
		fmt.Fprintln(s.w, "testsummary: no test results on stdin; run go test -json ./... | go run ./scripts/testsummary")
		return false
	case len(s.failed) > 0:
		fmt.Fprintf(s.w, "FAIL: %d of %s failed (%s); tests: %d passed, %d failed, %d skipped, in %v\n",
			len(s.failed), count(len(s.seen), "package"), strings.Join(s.failed, ", "), s.tests.pass, s.tests.fail, s.tests.skip, took)
		return false
	}
	fmt.Fprintf(s.w, "ok: %s passed; tests: %d passed, %d skipped, in %v\n", count(s.passed, "package"), s.tests.pass, s.tests.skip, took)
	return true
}

// printSkips prints one line per package and reason, naming the tests.
func (s *summary) printSkips() {
	if len(s.skips) == 0 {
		return
	}
	type suite struct {
		pkg, reason string
		tests       []string
	}
	var suites []*suite
	for _, sk := range s.skips {
		i := slices.IndexFunc(suites, func(su *suite) bool { return su.pkg == sk.pkg && su.reason == sk.reason })
		if i < 0 {
			suites = append(suites, &suite{pkg: sk.pkg, reason: sk.reason})
			i = len(suites) - 1
		}
		suites[i].tests = append(suites[i].tests, sk.test)
	}
	slices.SortStableFunc(suites, func(a, b *suite) int { return strings.Compare(a.pkg, b.pkg) })
	prefix := commonDir(s.seen)
	fmt.Fprintf(s.w, "skipped (%s; go test -v shows each skip as it happens):\n", count(len(s.skips), "test"))
	for _, su := range suites {
		tests := su.tests[0]
		if n := len(su.tests); n > 1 {
			tests = fmt.Sprintf("%s and %d more", tests, n-1)
		}
		fmt.Fprintf(s.w, "  %s %s: %s\n", strings.TrimPrefix(su.pkg, prefix), tests, su.reason)
	}
}

// printSlow names the slowest top-level tests, slowest first.
func (s *summary) printSlow() {
	if len(s.slow) == 0 {
		return
	}
	slices.SortStableFunc(s.slow, func(a, b timed) int { return cmp.Compare(b.elapsed, a.elapsed) })
	prefix := commonDir(s.seen)
	var names []string
	for _, t := range s.slow[:min(len(s.slow), slowest)] {
		names = append(names, fmt.Sprintf("%s %s %.0fs", strings.TrimPrefix(t.pkg, prefix), t.test, t.elapsed))
	}
	fmt.Fprintf(s.w, "slowest tests (%.0f s or more; parallel tests overlap): %s\n", slowAfter, strings.Join(names, ", "))
}

// commonDir returns the directories that every path starts with, ending
// in "/", leaving each path at least its last element; "" unless there are
// two paths or more.
func commonDir(paths []string) string {
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	if len(paths) < 2 {
		return ""
	}
	common := strings.Split(paths[0], "/")
	for _, p := range paths {
		elems := strings.Split(p, "/")
		n := 0
		for n < len(common) && n < len(elems)-1 && common[n] == elems[n] {
			n++
		}
		common = common[:n]
	}
	if len(common) == 0 {
		return ""
	}
	return strings.Join(common, "/") + "/"
}

// count returns "1 noun" or "n nouns".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// framing reports whether an output line only frames the output of
// go test -v ("=== RUN   TestX" and the like).
func framing(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

// logPrefix is the file:line that testing puts before a logged line.
var logPrefix = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)

// reason is the reason of a skip: the last line the test logged, without
// its file:line.
func reason(line string) string {
	line = strings.TrimSpace(line)
	if line == "" {
		return "no reason given"
	}
	return logPrefix.ReplaceAllString(line, "")
}
