package limits

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// writeFile writes a test file, creating its directory.
func writeFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func rule(domain, key string, n int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: " + key + "\n    rate_limit:\n      unit: second\n      requests_per_unit: " + strconv.Itoa(n) + "\n"
}

// A directory holds one domain per file; Load reads the *.yaml and *.yml
// files in it and in its subdirectories at any depth (envoyproxy/ratelimit's
// config directory may nest), and nothing else. On the old code, sub/ was
// skipped without a word.
func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), rule("edge", "remote_address", 10))
	writeFile(t, filepath.Join(dir, "api.yml"), rule("api", "user", 20))
	writeFile(t, filepath.Join(dir, "billing.YAML"), rule("billing", "account", 30))
	writeFile(t, filepath.Join(dir, "README.md"), "not yaml: [")
	writeFile(t, filepath.Join(dir, ".hidden.yaml"), "not: [valid")
	writeFile(t, filepath.Join(dir, "sub", "nested.yaml"), rule("nested", "k", 1))
	writeFile(t, filepath.Join(dir, "sub", "deeper", "deep.yml"), rule("deep", "k", 2))
	writeFile(t, filepath.Join(dir, "sub", ".hidden", "skipped.yaml"), "not: [valid")
	if err := os.Mkdir(filepath.Join(dir, "dir.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}

	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	if got, want := c.Domains(), []string{"api", "billing", "deep", "edge", "nested"}; !slices.Equal(got, want) {
		t.Errorf("Domains = %v; want %v", got, want)
	}
	wantFiles := []string{filepath.Join(dir, "api.yml"), filepath.Join(dir, "billing.YAML"), filepath.Join(dir, "edge.yaml"),
		filepath.Join(dir, "sub", "deeper", "deep.yml"), filepath.Join(dir, "sub", "nested.yaml")}
	if got := c.Files(); !slices.Equal(got, wantFiles) {
		t.Errorf("Files = %v; want %v", got, wantFiles)
	}
	runLookups(t, c, []lookupCase{
		{"edge", d("remote_address=1.2.3.4"), "10/second"},
		{"api", d("user=bob"), "20/second"},
		{"billing", d("account=7"), "30/second"},
		{"api", d("remote_address=1.2.3.4"), "none"},
		{"deep", d("k=1"), "2/second"},
	})
	r, _ := c.Lookup("api", d("user=bob"))
	if r.File != filepath.Join(dir, "api.yml") || r.Line != 3 {
		t.Errorf("rule at %s:%d; want %s:3", r.File, r.Line, filepath.Join(dir, "api.yml"))
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.conf") // any name will do for a file
	writeFile(t, path, rule("edge", "remote_address", 10))
	c, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	runLookups(t, c, []lookupCase{{"edge", d("remote_address=x"), "10/second"}})
}

func TestLoadErrors(t *testing.T) {
	t.Run("duplicate domain", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "a.yaml"), rule("edge", "k", 1))
		writeFile(t, filepath.Join(dir, "b.yaml"), "# the same domain again\n"+rule("edge", "j", 2))
		_, err := Load(dir)
		want := "limits: " + filepath.Join(dir, "b.yaml") + ":2: domain \"edge\" is already defined in " +
			filepath.Join(dir, "a.yaml") + ":1; each domain must be in exactly one file, so merge the two files, or let domains span files with --merge-domain-config"
		if err == nil || err.Error() != want {
			t.Errorf("Load = %v; want %s", err, want)
		}
	})
	t.Run("problems in several files", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
		writeFile(t, filepath.Join(dir, "b.yaml"), "domain: b\ndescriptors:\n  - value: v\n")
		_, err := Load(dir)
		want := "limits: " + filepath.Join(dir, "a.yaml") + ":4: unknown unit \"fortnight\" (want second, minute, hour, day, week, month or year)\n" +
			"limits: " + filepath.Join(dir, "b.yaml") + ":3: the descriptor has no key; add key: <descriptor key>, the key Envoy sends in its descriptor entry"
		if err == nil || err.Error() != want {
			t.Errorf("Load = %v\nwant %s", err, want)
		}
	})
	t.Run("missing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nope")
		_, err := Load(path)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load(missing) = %v; want an error matching fs.ErrNotExist", err)
		}
		if want := "limits: " + path + ": cannot read the limits path: no such file or directory"; err == nil || err.Error() != want {
			t.Errorf("Load(missing) = %v; want %s", err, want)
		}
	})
	t.Run("symlink loop", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "a.yaml"), rule("edge", "k", 1))
		writeFile(t, filepath.Join(dir, "sub", "b.yaml"), rule("api", "k", 1))
		if err := os.Symlink("..", filepath.Join(dir, "sub", "up")); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), "directories deep (a symlink loop?)") {
			t.Errorf("Load(a directory with a symlink to its parent) = %v; want a symlink loop refused", err)
		}
	})
	t.Run("empty directory", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "notes.txt"), "hello")
		_, err := Load(dir)
		if want := "limits: " + dir + ": the directory has no *.yaml or *.yml file, nor a subdirectory holding some; add one file per domain"; err == nil || err.Error() != want {
			t.Errorf("Load(empty) = %v; want %s", err, want)
		}
	})
}

// configMap lays out dir as Kubernetes mounts a ConfigMap: the files are
// symlinks through ..data, a symlink to a timestamped directory. Each call
// writes a new timestamped directory and swaps ..data to it atomically.
func configMap(t testing.TB, dir, version string, files map[string]string) {
	t.Helper()
	ts := "..v" + version
	for name, data := range files {
		writeFile(t, filepath.Join(dir, ts, name), data)
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, fs.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	configMap(t, dir, "1", map[string]string{"edge.yaml": rule("edge", "remote_address", 10)})
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := c.Domains(); !slices.Equal(got, []string{"edge"}) {
		t.Errorf("Domains = %v; want [edge] (the ..data and ..v1 entries skipped)", got)
	}
}

// TestLoadRuntimeLayout: pointed at envoyproxy/ratelimit's runtime directory
// (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY), whose limits are under config/, at
// any depth, Load reads them as envoyproxy/ratelimit does (and skips the
// other runtime subdirectories, as it does), and a ConfigMap mounted at
// config/ too.
func TestLoadRuntimeLayout(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit")
	writeFile(t, filepath.Join(dir, "config", "edge.yaml"), rule("edge", "remote_address", 10))
	writeFile(t, filepath.Join(dir, "config", "teams", "api.yaml"), rule("api", "user", 20))
	writeFile(t, filepath.Join(dir, "config", ".hidden", "x.yaml"), "not: [valid")
	writeFile(t, filepath.Join(dir, "other", "skipped.yaml"), "not: [valid")
	c, err := Load(dir)
	if err != nil {
		t.Fatalf("Load(%s): %v", dir, err)
	}
	if got, want := c.Domains(), []string{"api", "edge"}; !slices.Equal(got, want) {
		t.Errorf("Domains = %v; want %v", got, want)
	}
	runLookups(t, c, []lookupCase{
		{"edge", d("remote_address=1.2.3.4"), "10/second"},
		{"api", d("user=bob"), "20/second"},
	})

	cm := filepath.Join(t.TempDir(), "ratelimit")
	configMap(t, filepath.Join(cm, "config"), "1", map[string]string{"edge.yaml": rule("edge", "remote_address", 10)})
	if c, err := Load(cm); err != nil || !slices.Equal(c.Domains(), []string{"edge"}) {
		t.Errorf("Load(a ConfigMap at config/) = %v; want the domain edge", err)
	}
}

// TestLoadMergeDomains: with MergeDomains, the files of one domain put
// their top-level descriptors together, as envoyproxy/ratelimit's
// MERGE_DOMAIN_CONFIG does; a top-level descriptor in two files is still
// an error, naming both places.
func TestLoadMergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), rule("edge", "remote_address", 10))
	writeFile(t, filepath.Join(dir, "b.yaml"), rule("edge", "user", 20)+"  - key: remote_address\n    value: 10.0.0.1\n    rate_limit: {unit: second, requests_per_unit: 0}\n")
	writeFile(t, filepath.Join(dir, "c.yaml"), rule("api", "user", 30))

	if _, err := Load(dir); err == nil {
		t.Fatal("Load of a domain in two files without MergeDomains: no error")
	}
	c, err := LoadOptions{MergeDomains: true}.Load(dir)
	if err != nil {
		t.Fatalf("Load with MergeDomains: %v", err)
	}
	if got, want := c.Domains(), []string{"api", "edge"}; !slices.Equal(got, want) {
		t.Errorf("Domains = %v; want %v", got, want)
	}
	runLookups(t, c, []lookupCase{
		{"edge", d("remote_address=1.2.3.4"), "10/second"},
		{"edge", d("remote_address=10.0.0.1"), "0/second"},
		{"edge", d("user=bob"), "20/second"},
		{"api", d("user=bob"), "30/second"},
	})
	var files []string
	for _, r := range c.Rules("edge") {
		files = append(files, filepath.Base(r.File)+":"+strconv.Itoa(r.Line))
	}
	if want := []string{"a.yaml:3", "b.yaml:3", "b.yaml:7"}; !slices.Equal(files, want) {
		t.Errorf("Rules(edge) at %v; want %v (load order)", files, want)
	}

	writeFile(t, filepath.Join(dir, "d.yaml"), "# again\n"+rule("edge", "user", 5))
	_, err = LoadOptions{MergeDomains: true}.Load(dir)
	want := "limits: " + filepath.Join(dir, "d.yaml") + ":4: descriptor key=user is also at the top of domain \"edge\" in " +
		filepath.Join(dir, "b.yaml") + ":3; a domain that spans files may not repeat a top-level descriptor, so merge the two into one"
	if err == nil || err.Error() != want {
		t.Errorf("Load with a top-level descriptor in two files = %v\nwant %s", err, want)
	}
}
