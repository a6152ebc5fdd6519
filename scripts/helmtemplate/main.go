// Command helmtemplate renders a Helm chart as `helm template` does, with
// Helm's own packages (the chart loader, the values rules, the template
// engine, the manifest sorter), without the rest of the helm command: it
// builds in a fraction of helm's time, which is what a cold CI run pays
// (TestHelmChart in cmd/sluice runs it).
//
// Usage:
//
//	helmtemplate [-f FILE]... [--set K=V]... [--set-string K=V]... [--set-file K=FILE]... [--notes] [--is-upgrade] RELEASE CHART
//
// As helm does, it merges the -f files in order, then every --set, then
// every --set-string, then every --set-file, whatever order they come in.
// It prints the manifests, then the hooks, each after a "# Source:" line;
// with --notes, the chart's NOTES.txt follows them after a "# Notes" line
// (helm install prints it; helm template does not). With --is-upgrade it
// renders as helm upgrade does (.Release.IsUpgrade), else as helm install
// (.Release.IsInstall). Errors go to standard
// error, with exit status 1.
//
// It lives in a module of its own, so that Helm's dependencies are not the
// service's.
package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "helmtemplate:", err)
		os.Exit(1)
	}
}

func run(args []string, w io.Writer) error {
	var files, sets, strs, fileSets, pos []string
	notes, upgrade := false, false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "--notes":
			notes = true
			continue
		case "--is-upgrade":
			upgrade = true
			continue
		case "-f", "--values", "--set", "--set-string", "--set-file":
		default:
			if strings.HasPrefix(a, "-") {
				return fmt.Errorf("unknown flag %s", a)
			}
			pos = append(pos, a)
			continue
		}
		if i+1 == len(args) {
			return fmt.Errorf("%s needs a value", a)
		}
		i++
		switch a {
		case "-f", "--values":
			files = append(files, args[i])
		case "--set":
			sets = append(sets, args[i])
		case "--set-string":
			strs = append(strs, args[i])
		default:
			fileSets = append(fileSets, args[i])
		}
	}
	if len(pos) != 2 {
		return fmt.Errorf("want RELEASE CHART, got %q", pos)
	}
	release, dir := pos[0], pos[1]

	vals := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("parse %s: %w", f, err)
		}
		vals = merge(vals, m)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return fmt.Errorf("--set %s: %w", s, err)
		}
	}
	for _, s := range strs {
		if err := strvals.ParseIntoString(s, vals); err != nil {
			return fmt.Errorf("--set-string %s: %w", s, err)
		}
	}
	for _, s := range fileSets {
		read := func(name []rune) (any, error) {
			b, err := os.ReadFile(string(name))
			return string(b), err
		}
		if err := strvals.ParseIntoFile(s, vals, read); err != nil {
			return fmt.Errorf("--set-file %s: %w", s, err)
		}
	}

	ch, err := loader.Load(dir)
	if err != nil {
		return err
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return err
	}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: "default", Revision: 1, IsInstall: !upgrade, IsUpgrade: upgrade}, chartutil.DefaultCapabilities)
	if err != nil {
		return err
	}
	out, err := engine.Engine{}.Render(ch, top)
	if err != nil {
		return err
	}
	note := out[path.Join(ch.Name(), "templates", "NOTES.txt")]
	for k := range out { // helm renders no chart's notes as a manifest
		if strings.HasSuffix(k, "NOTES.txt") {
			delete(out, k)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(out, nil, releaseutil.InstallOrder)
	if err != nil {
		return err
	}
	for _, m := range manifests {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	for _, h := range hooks {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	if notes {
		fmt.Fprintf(w, "# Notes\n%s\n", note)
	}
	return nil
}

// merge merges b into a as helm merges values files: maps deeply, the
// rest replaced.
func merge(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if bm, ok := v.(map[string]any); ok {
			if am, ok := out[k].(map[string]any); ok {
				out[k] = merge(am, bm)
				continue
			}
		}
		out[k] = v
	}
	return out
}
