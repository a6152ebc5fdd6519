// Command mutants checks that the tests catch the bugs they are meant to:
// it applies one deliberate bug (a mutant) to a copy of this tree, runs
// the tests that must catch it, and exits 0 only if one of them failed
// (the mutant was killed).
//
//	go run ./scripts/mutants [-all] [-keep] NAME... | all
//	go run ./scripts/mutants -list
//
// Each mutant is a few edits of exact source text. A mutant whose text is
// no longer in the tree, or that does not build, is an error (exit 2):
// its name stays, and its edits follow the code they break. The tests of
// a mutant run in order, cheapest first, with -race, each under go test
// -json; the first that fails kills the mutant (-all runs every one, to
// see which catch it). A test that skips, or a run in which nothing
// failed but something did not run, is an error too: a mutant counts as
// killed only by a test that ran and failed. The fault suite's rows need
// root and network namespaces (see cluster/faults); the copy is made from
// the work tree, uncommitted changes included, so a mutant can be tried
// against a change before it is committed.
//
// Exit status: 0 every mutant named was killed, 1 one survived, 2 an
// error (a mutant that no longer applies or builds, a test that could not
// run).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// edit replaces old, which must occur exactly once in file, by new.
type edit struct {
	file, old, new string
}

// check is one go test run: a package and a -run pattern.
type check struct {
	pkg, run string
}

// mutant is one deliberate bug and the tests that must catch it.
type mutant struct {
	name, what string
	edits      []edit
	checks     []check
}

// faultRows runs rows of the fault suite.
func faultRows(run string) check { return check{"./cluster/faults/", run} }

var mutants = []mutant{
	{
		name: "no-lease",
		what: "no lease check before deciding, nor after the commit",
		edits: []edit{
			{"cluster/router.go",
				"func (r *Router) admit(ctx context.Context, own *ownership, checks []actor.Check) error {\n\tif err := r.leaseErr(); err != nil {",
				"func (r *Router) admit(ctx context.Context, own *ownership, checks []actor.Check) error {\n\tif err := r.leaseErr(); false && err != nil {"},
			{"cluster/router.go",
				"\tif !r.ctl().LeaseValidFor(epoch) {",
				"\tif false && !r.ctl().LeaseValidFor(epoch) {"},
		},
		checks: []check{faultRows("TestFaults/lease-only/partition")},
	},
	{
		name: "long-lease",
		what: "a lease outlives the leader's wait before it ends the epoch (3 L instead of L)",
		edits: []edit{
			{"cluster/control/lease.go",
				"if end := int64(sent + h.length); end > h.until.Load() {",
				"if end := int64(sent + 3*h.length); end > h.until.Load() {"},
		},
		checks: []check{
			{"./cluster/control/", "TestHolderExpiry"},
			faultRows("TestFaults/lease-only/partition"),
			faultRows("TestFaults/lease-only/pauses-at-the-edge"),
		},
	},
	{
		name: "clock-beyond-rho",
		what: "a node's lease clock at half the real rate, beyond the drift the lease assumes",
		edits: []edit{
			{"cluster/faults/faults_test.go",
				`nodeFlags: map[int][]string{2: {"--test-lease-clock-rate", "0.95"}},`,
				`nodeFlags: map[int][]string{2: {"--test-lease-clock-rate", "0.5"}},`},
		},
		checks: []check{faultRows("TestFaults/lease-only/slow-clock")},
	},
	{
		name: "stale-copies",
		what: "a standby takes copies from an owner whose epoch its map has ended",
		edits: []edit{
			{"cluster/replica.go",
				"\tcase own.cur.epochs[req.FromNode] != req.FromEpoch:",
				"\tcase false && own.cur.epochs[req.FromNode] != req.FromEpoch:"},
		},
		checks: []check{
			{"./cluster/", "TestStandbyRefusesEndedEpochs"},
			faultRows("TestFaults/partition$"),
			faultRows("TestFaults/one-way-cut"),
			faultRows("TestFaults/pause"),
		},
	},
	{
		name: "ack-before-copy",
		what: "a write is acknowledged whether or not its standby confirmed it",
		edits: []edit{
			{"actor/actor.go",
				"\t\terr = fmt.Errorf(\"%w: %w\", ErrReplication, err)",
				"\t\terr = nil"},
		},
		checks: []check{faultRows("TestDoubleFaults/cut-then-wiped-disk")},
	},
	{
		name: "no-fence",
		what: "the actors never refuse a call routed under an older ownership",
		edits: []edit{
			{"actor/actor.go",
				"if c.gen != 0 && c.op == opCheck && c.gen != a.e.gen.Load() && !a.owns(c) {",
				"if false && c.gen != 0 && c.op == opCheck && c.gen != a.e.gen.Load() && !a.owns(c) {"},
		},
		checks: []check{
			{"./actor/", "TestFence"},
			faultRows("TestFaults/rolling-restart/join-first"),
		},
	},
	{
		name: "lease-at-grant",
		what: "a quota lease's hits dated at its grant rather than its expiry",
		edits: []edit{
			{"actor/state.go",
				"\ts.logAdd(expires, c.Cost, maxRuns)",
				"\ts.logAdd(now, c.Cost, maxRuns)"},
		},
		checks: []check{{"./actor/", "TestLeaseLedger"}, {"./cmd/sluice/node/", "TestLeaseRuleLedger"}},
	},
	{
		name: "no-fair-share",
		what: "leases granted whatever their holders' fair shares",
		edits: []edit{
			{"actor/fair.go",
				"\tif total <= capacity || len(sh) < 2 {",
				"\tif true || total <= capacity || len(sh) < 2 {"},
		},
		checks: []check{{"./actor/", "TestLeaseFairShare"}, {"./client/", "TestLeaseFairShare"}, {"./cmd/sluice/node/", "TestLeaseRuleFairShare"}},
	},
	{
		name: "partition-out-of-sync-leader",
		what: "a partition handed to a replica that is not in sync (it may lack acknowledged hits)",
		edits: []edit{
			{"cluster/control/partition.go",
				"\tcase !p.inSync(to):",
				"\tcase false:"},
		},
		checks: []check{{"./cluster/control/", "TestPartitionWaitsForItsLastInSync|TestPartitionInvariantsUnderRandomCommands"}},
	},
	{
		name: "partition-copies-from-any-node",
		what: "a follower takes copies of a partition from a node that does not lead it in its map",
		edits: []edit{
			{"cluster/partitions.go",
				"\t\tif l := c.parts[p].Leader; l != x.ID {",
				"\t\tif l := c.parts[p].Leader; l != x.ID && false {"},
		},
		checks: []check{{"./cluster/", "TestFollowerTakesCopiesOnlyFromTheLeader"}},
	},
	{
		name: "partition-stale-memory",
		what: "a node that takes a partition back decides from what its actors held of its keys when it last led it",
		edits: []edit{
			{"cluster/partitions.go",
				"\t\t_, err := r.cfg.Engine.Evict(context.Background(), func(key string) bool {\n\t\t\treturn set[shard.Partition(shard.Hash(key), n)]\n\t\t})",
				"\t\tvar err error"},
		},
		checks: []check{{"./cmd/sluice/node/", "TestPartitionsLeaderMovesBackAndForth"}},
	},
	{
		name: "rlqs-no-lease",
		what: "an RLQS assignment sent whether or not the key's owner granted its lease (and the room assumed whole)",
		edits: []edit{
			{"api/rlqs.go",
				"\tif !out[0].Allowed {\n\t\treturn false, 0\n\t}\n",
				"\treturn true, n\n"},
			{"api/rlqs.go",
				"\treturn out[0].Remaining, true",
				"\treturn b.limit, true"},
		},
		checks: []check{{"./cmd/sluice/node/", "TestRLQSAcrossNodes"}},
	},
	{
		name: "rlqs-part-of-a-lease",
		what: "an RLQS assignment sent again on part of the lease it needs (its lease had ended, and a new one got only part)",
		edits: []edit{
			{"api/rlqs.go",
				"\tif g < n && id != b.leaseID {",
				"\tif g < n && (true || id != b.leaseID) {"},
		},
		checks: []check{{"./cmd/sluice/node/", "TestRLQSSilentThenBack"}},
	},
	{
		name: "no-tombstone",
		what: "a forgotten member's keys are decided from nothing",
		edits: []edit{
			{"cluster/ownership.go",
				"\t\tif c.tombstoneHeld(t, h) {",
				"\t\tif false && c.tombstoneHeld(t, h) {"},
		},
		checks: []check{
			{"./cluster/", "TestPenalties"},
			faultRows("TestOperatorFlows/forget-then-replace"),
		},
	},
}

func main() {
	all := flag.Bool("all", false, "run every test of a mutant, not only up to the first that kills it")
	keep := flag.Bool("keep", false, "keep the mutated copies and the tests' output (printed) instead of removing them")
	list := flag.Bool("list", false, "list the mutants and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./scripts/mutants [-all] [-keep] NAME... | all\n       go run ./scripts/mutants -list\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *list {
		for _, m := range mutants {
			fmt.Printf("%-16s %s\n", m.name, m.what)
		}
		return
	}
	chosen, err := choose(flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		flag.Usage()
		os.Exit(2)
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(2)
	}
	code := 0
	for _, m := range chosen {
		killed, err := run(root, m, *all, *keep)
		switch {
		case err != nil:
			fmt.Printf("mutant %s: error: %v\n", m.name, err)
			code = 2
		case !killed:
			fmt.Printf("mutant %s: SURVIVED: %s passed every test meant to catch it\n", m.name, m.what)
			code = max(code, 1)
		}
	}
	os.Exit(code)
}

// choose returns the mutants named, every one for "all".
func choose(names []string) ([]mutant, error) {
	if len(names) == 0 {
		return nil, errors.New("name a mutant, or all")
	}
	if len(names) == 1 && names[0] == "all" {
		return mutants, nil
	}
	var out []mutant
	for _, n := range names {
		i := slices.IndexFunc(mutants, func(m mutant) bool { return m.name == n })
		if i < 0 {
			return nil, fmt.Errorf("no mutant %q (see -list)", n)
		}
		out = append(out, mutants[i])
	}
	return out, nil
}

// moduleRoot returns the directory of this module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not in a module: run it from the repository")
	}
	return filepath.Dir(mod), nil
}

// run applies m to a copy of the tree at root and runs its checks. It
// reports whether one of them failed.
func run(root string, m mutant, all, keep bool) (killed bool, err error) {
	dir, err := os.MkdirTemp("", "sluice-mutant-"+m.name+"-")
	if err != nil {
		return false, err
	}
	if keep {
		fmt.Printf("mutant %s: copy in %s\n", m.name, dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if err := copyTree(root, dir); err != nil {
		return false, fmt.Errorf("copy the tree: %v", err)
	}
	for _, e := range m.edits {
		if err := apply(dir, e); err != nil {
			return false, err
		}
	}
	fmt.Printf("mutant %s: %s\n", m.name, m.what)
	for _, c := range m.checks {
		start := time.Now()
		res, err := test(dir, c, keep)
		if err != nil {
			return killed, fmt.Errorf("%s -run '%s': %v", c.pkg, c.run, err)
		}
		took := time.Since(start).Round(time.Second)
		if len(res.failed) > 0 {
			fmt.Printf("mutant %s: killed by %s %s (%v)\n", m.name, c.pkg, strings.Join(res.failed, ", "), took)
			killed = true
			if !all {
				return true, nil
			}
			continue
		}
		fmt.Printf("mutant %s: not caught by %s -run '%s': %d tests passed (%v)\n", m.name, c.pkg, c.run, res.passed, took)
	}
	return killed, nil
}

// copyTree copies the files git knows of, and the untracked ones it does
// not ignore, from root to dir.
func copyTree(root, dir string) error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// apply makes edit e in the copy at dir.
func apply(dir string, e edit) error {
	path := filepath.Join(dir, e.file)
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %v", e.file, err)
	}
	if n := bytes.Count(b, []byte(e.old)); n != 1 {
		return fmt.Errorf("%s has the text the mutant changes %d times, want once: the code moved; update the mutant's edit (%q)", e.file, n, firstLine(e.old))
	}
	return os.WriteFile(path, bytes.Replace(b, []byte(e.old), []byte(e.new), 1), 0o644)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// result is what one go test run did.
type result struct {
	passed int
	failed []string // the failing tests, by name
}

// test runs go test -race -json for c in dir. A build failure, a test
// that skipped, or a run with no test, is an error.
func test(dir string, c check, keep bool) (result, error) {
	var res result
	cmd := exec.Command("go", "test", "-race", "-count=1", "-json", "-run", c.run, c.pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CI=") // a test that cannot run skips, and is reported as such
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	if err := cmd.Start(); err != nil {
		return res, err
	}
	var skipped []string
	var output strings.Builder
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct {
			Action, Test, Output string
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch {
		case ev.Action == "output":
			output.WriteString(ev.Output)
		case ev.Test == "":
		case ev.Action == "pass":
			res.passed++
		case ev.Action == "fail":
			res.failed = append(res.failed, ev.Test)
		case ev.Action == "skip":
			skipped = append(skipped, ev.Test)
		}
	}
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	if keep {
		log := filepath.Join(dir, "mutant-test-"+strings.NewReplacer("/", "_", "$", "").Replace(c.pkg+c.run)+".log")
		os.WriteFile(log, []byte(output.String()), 0o644)
		fmt.Printf("  output: %s\n", log)
	}
	switch {
	case len(res.failed) > 0:
		return res, nil
	case werr != nil:
		return res, fmt.Errorf("go test failed without a failing test (the mutant does not build?): %v\n%s%s", werr, tail(output.String(), 20), tail(stderr.String(), 20))
	case len(skipped) > 0:
		return res, fmt.Errorf("skipped: %s\n%s", strings.Join(skipped, ", "), tail(output.String(), 5))
	case res.passed == 0:
		return res, errors.New("no test matched")
	}
	return res, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
