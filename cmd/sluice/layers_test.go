package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// floors are the layers of docs/architecture.md, lowest first: a package
// (its non-test files) may import the module's packages of its own floor
// and of the floors below, never above. The longest prefix names a
// package's floor. scripts/testkit (the tests' polling and buffers) is on
// the ground floor, so that the test harnesses of every floor may use it.
var floors = []struct {
	floor    int
	prefixes []string
}{
	{0, []string{"shard", "proto", "scripts/testkit"}},
	{1, []string{"persist"}},
	{2, []string{"actor"}},
	{3, []string{"cluster"}},
	{4, []string{"api"}},
	{5, []string{"cmd"}},
}

// public packages import nothing of the server's but its pure hashing
// (a client routes each key as the nodes do): only these.
var public = map[string][]string{
	"client": {"client", "proto", "shard"},
}

// TestImportsPointDown holds the module to the floors of
// docs/architecture.md.
func TestImportsPointDown(t *testing.T) {
	const module = "github.com/sluice-io/sluice/"
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	floorOf := func(pkg string) (int, bool) {
		best, floor := -1, 0
		for _, f := range floors {
			for _, p := range f.prefixes {
				if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > best {
					best, floor = len(p), f.floor
				}
			}
		}
		return floor, best >= 0
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir // hidden, test data, another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			dep, _ := strconv.Unquote(imp.Path.Value)
			dep, ours := strings.CutPrefix(dep, module)
			if !ours {
				continue
			}
			checked++
			top := strings.SplitN(pkg, "/", 2)[0]
			if allowed, ok := public[top]; ok {
				if !hasAnyPrefix(dep, allowed) {
					t.Errorf("%s imports %s: the public library imports only %v", rel, dep, allowed)
				}
				continue
			}
			from, ok1 := floorOf(pkg)
			to, ok2 := floorOf(dep)
			switch {
			case !ok1:
				t.Errorf("%s has no floor in docs/architecture.md (add it to floors)", pkg)
			case !ok2:
				if _, pub := public[strings.SplitN(dep, "/", 2)[0]]; !pub {
					t.Errorf("%s imports %s, which has no floor", pkg, dep)
				}
			case ok2 && to > from:
				t.Errorf("%s imports %s: an import points up (floor %d to %d; see docs/architecture.md)", pkg, dep, from, to)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked %d imports of the module's own packages; the walk went wrong", checked)
	}
}

// TestAPISeams holds package api (its non-test files) to the seams of
// docs/architecture.md: it sees decisions and the cluster through the
// interfaces it declares (Decider, Cluster, AdminPeers), never a concrete
// router or membership, and keeps no storage of its own (the overrides'
// is package api/overrides'), so it imports no persist.
func TestAPISeams(t *testing.T) {
	files, err := filepath.Glob("../../api/*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		checked++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if dep, _ := strconv.Unquote(imp.Path.Value); dep == "github.com/sluice-io/sluice/persist" {
				t.Errorf("%s imports persist: api keeps no storage of its own", path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "cluster" {
				switch sel.Sel.Name {
				case "Router", "Membership", "NewRouter", "New":
					t.Errorf("%s: %s names cluster.%s: api sees the cluster through its own interfaces (Decider, Cluster, AdminPeers)", path, fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("checked %d files of package api; the glob went wrong", checked)
	}
}

func hasAnyPrefix(pkg string, prefixes []string) bool {
	for _, p := range prefixes {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
