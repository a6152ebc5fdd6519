package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// helmChart is the Helm chart, from this package's directory.
const helmChart = "../../scripts/k8s/helm/sluice"

// TestHelmChart: the chart renders (helm template) manifests that decode
// strictly and pass checkManifests, by default and with its options set;
// its default rendering is the kustomize manifests in substance (the same
// objects with the same specs: args, env, ports, probes, resources,
// scheduling, Services, budget, NetworkPolicy; labels and the image
// aside), and so are its ServiceMonitor and Secret, so that the two
// cannot drift apart silently. It renders with scripts/helmtemplate
// (Helm's own packages), which it builds (see helmBinary).
func TestHelmChart(t *testing.T) {
	t.Parallel()
	helm := helmBinary(t)
	kustomized := loadManifestDir(t, k8sDir)
	k := one[*kustomization](t, kustomized, "")
	var applied, optional manifests
	for _, d := range kustomized {
		switch {
		case slices.Contains(k.Resources, d.file):
			applied = append(applied, d)
		case d.file != "kustomization.yaml":
			optional = append(optional, d)
		}
	}

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		docs := helmTemplate(t, helm, "sluice")
		checkManifests(t, docs)
		sameInSubstance(t, applied, docs, podLabelsOf(t, kustomized), podLabelsOf(t, docs))
	})

	t.Run("service monitor and secret", func(t *testing.T) {
		t.Parallel()
		docs := helmTemplate(t, helm, "sluice", "--set", "serviceMonitor.enabled=true", "--set", "auth.create=true", "--set", "auth.adminToken=t0ken")
		var want, got manifests
		for _, d := range optional {
			if _, ok := d.obj.(*corev1.Secret); !ok {
				want = append(want, d)
			}
		}
		for _, d := range docs {
			if _, ok := d.obj.(*serviceMonitor); ok {
				got = append(got, d)
			}
		}
		sameInSubstance(t, want, got, podLabelsOf(t, kustomized), podLabelsOf(t, docs))
		// The Secret has the keys of the example's, which the pods read.
		example := one[*corev1.Secret](t, optional, "sluice")
		secret := one[*corev1.Secret](t, docs, "sluice")
		if w, g := slices.Sorted(maps.Keys(example.StringData)), slices.Sorted(maps.Keys(secret.StringData)); !slices.Equal(w, g) {
			t.Errorf("the chart's Secret has keys %v; the example's %v", g, w)
		}
		checkManifests(t, docs)
	})

	t.Run("options", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		edge, api := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "api.yaml")
		for path, domain := range map[string]string{edge: "edge", api: "api"} {
			if err := os.WriteFile(path, []byte("domain: "+domain+"\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		values := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(values, []byte(`
priorityClassName: critical
podLabels: {team: edge}
podAnnotations: {owner: sre}
extraEnv:
  - {name: SLUICE_LOG_LEVEL, value: debug}
tolerations:
  - {key: dedicated, operator: Exists}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions: [{key: pool, operator: Exists}]
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels: {app.kubernetes.io/name: sluice, app.kubernetes.io/instance: edge}
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/region
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels: {app.kubernetes.io/name: sluice, app.kubernetes.io/instance: edge}
`), 0o600); err != nil {
			t.Fatal(err)
		}
		docs := helmTemplate(t, helm, "edge", "-f", values,
			"--set", "replicas=5",
			"--set", "resources.limits.memory=2Gi",
			"--set", "tls.secretName=sluice-tls", "--set", "tls.clientCA=true",
			"--set-file", "limits.edge\\.yaml="+edge, "--set-file", "limits.api\\.yaml="+api,
			"--set", "serviceMonitor.enabled=true",
			"--set", "persistence.storageClassName=zonal",
			"--set", "extraArgs={--durability=fsync}")
		checkManifests(t, docs)
		sts := one[*appsv1.StatefulSet](t, docs, "edge-sluice")
		pod := &sts.Spec.Template.Spec
		c := container(t, pod, "sluice")
		// --expect stays at the size the cluster is created with: scaling
		// to 5 does not change it, nor restart the pods.
		for _, want := range []string{"--expect=3", "--tls-client-ca=/etc/sluice/tls/ca.crt", "--limits-file=/etc/sluice/limits", "--durability=fsync",
			"--join=edge-sluice-headless.$(POD_NAMESPACE).svc.cluster.local:7946"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args %q lack %s", c.Args, want)
			}
		}
		if got := one[*corev1.ConfigMap](t, docs, "edge-sluice-limits").Data; len(got) != 2 || got["edge.yaml"] == "" || got["api.yaml"] == "" {
			t.Errorf("limits ConfigMap holds %v; want edge.yaml and api.yaml", slices.Sorted(maps.Keys(got)))
		}
		// The hook checks the same files with the release's image.
		job := one[*batchv1.Job](t, docs, "edge-sluice-limits-check")
		jc := container(t, &job.Spec.Template.Spec, "limits-check")
		if hook := job.Annotations["helm.sh/hook"]; hook != "pre-install,pre-upgrade" || jc.Image != c.Image ||
			!slices.Equal(jc.Args, []string{"limits", "check", "/etc/sluice/limits"}) {
			t.Errorf("limits check Job: hook %q, image %s, args %q; want pre-install,pre-upgrade, %s, limits check /etc/sluice/limits", hook, jc.Image, jc.Args, c.Image)
		}
		if got := one[*corev1.ConfigMap](t, docs, "edge-sluice-limits-check").Data; len(got) != 2 {
			t.Errorf("limits check ConfigMap holds %v; want the two files", slices.Sorted(maps.Keys(got)))
		}
		if pod.PriorityClassName != "critical" || sts.Spec.Template.Labels["team"] != "edge" || sts.Spec.Template.Annotations["owner"] != "sre" ||
			len(pod.Tolerations) != 1 || pod.Affinity.NodeAffinity == nil || pod.Affinity.PodAntiAffinity == nil ||
			len(pod.TopologySpreadConstraints) != 2 {
			t.Errorf("pod: priorityClassName %q, labels %v, annotations %v, tolerations %v, affinity %+v, spread %+v; want the values'",
				pod.PriorityClassName, sts.Spec.Template.Labels, sts.Spec.Template.Annotations, pod.Tolerations, pod.Affinity, pod.TopologySpreadConstraints)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "SLUICE_LOG_LEVEL" && e.Value == "debug" }) {
			t.Errorf("env %v lacks extraEnv's SLUICE_LOG_LEVEL=debug", c.Env)
		}
		// One scrape path: with a ServiceMonitor, no scrape annotations.
		if _, ok := sts.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
			t.Errorf("pod annotations %v with a ServiceMonitor: each node would be scraped twice", sts.Spec.Template.Annotations)
		}
	})

	t.Run("image", func(t *testing.T) {
		t.Parallel()
		// The image's tag is the chart's appVersion, a release's: never a
		// tag that moves.
		b, err := os.ReadFile(filepath.Join(helmChart, "Chart.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var chart struct {
			AppVersion string `json:"appVersion"`
		}
		if err := sigsyaml.Unmarshal(b, &chart); err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(chart.AppVersion) {
			t.Errorf("appVersion %q; want a release's version", chart.AppVersion)
		}
		docs := helmTemplate(t, helm, "sluice")
		if img := container(t, &one[*appsv1.StatefulSet](t, docs, "").Spec.Template.Spec, "sluice").Image; !strings.HasSuffix(img, ":"+chart.AppVersion) {
			t.Errorf("image %s; want the tag %s, the chart's appVersion", img, chart.AppVersion)
		}
	})

	t.Run("refused at render", func(t *testing.T) {
		t.Parallel()
		// What would leave a cluster that never forms, or limits that do
		// not load, fails helm template (and install) with a reason.
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"--set", "expect=4"}, "expect 4: want from 1 to replicas (3)"},
			// Half of the pods or fewer could bootstrap two clusters.
			{[]string{"--set", "replicas=6"}, "expect 3: a new install wants more than half of replicas (6)"},
			{[]string{"--set-string", "limits.edge\\.yaml=domain: ["}, "limits: edge.yaml is not YAML"},
			{[]string{"--set-string", "limits.edge\\.yaml=descriptors: []"}, "limits: edge.yaml names no domain"},
			{[]string{"--set-string", "limits.edge/x\\.yaml=domain: edge"}, "want NAME.yaml or NAME.yml"},
		} {
			out, err := helmRun(helm, "sluice", tt.args...)
			if err == nil || !strings.Contains(out, tt.want) {
				t.Errorf("helm template %q: %v\n%s\nwant a failure saying %q", tt.args, err, out, tt.want)
			}
		}
		// A cluster created at 3 scales to 7 by an upgrade, --expect
		// unchanged (it is ignored once the cluster exists).
		if out, err := helmRun(helm, "sluice", "--is-upgrade", "--set", "replicas=7"); err != nil {
			t.Errorf("helm upgrade --set replicas=7 (expect 3): %v\n%s\nwant it rendered", err, out)
		}
		// NOTES.txt renders (helm template leaves it out; helm install
		// prints it), naming the Secret to create and the limits.
		out, err := helmRun(helm, "sluice", "--notes", "--set-string", "limits.edge\\.yaml=domain: edge")
		_, notes, _ := strings.Cut(out, "# Notes\n")
		if err != nil || !strings.Contains(notes, "The pods need the Secret sluice") || !strings.Contains(notes, "Limits: edge.yaml") {
			t.Errorf("NOTES.txt: %v\n%s\nwant notes naming the Secret sluice and the limits edge.yaml", err, out)
		}
	})

	t.Run("preferred anti-affinity", func(t *testing.T) {
		t.Parallel()
		docs := helmTemplate(t, helm, "sluice", "--set", "podAntiAffinity=preferred")
		a := one[*appsv1.StatefulSet](t, docs, "").Spec.Template.Spec.Affinity.PodAntiAffinity
		if len(a.RequiredDuringSchedulingIgnoredDuringExecution) != 0 || len(a.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Errorf("podAntiAffinity=preferred renders %+v; want one preferred term and no required one", a)
		}
	})
}

// helmRenderer is scripts/helmtemplate, built by helmBinary.
var helmRenderer built

// helmBinary builds scripts/helmtemplate, which renders a chart as helm
// template does, with Helm's own packages (a module of its own, pinned):
// from an empty build cache, once go vet -race has built the Kubernetes
// API packages it shares with the tests, 78 CPU-seconds (41 s on a quiet
// machine), a quarter of the whole helm command's. Under -short the test
// is skipped; where the build fails (Helm's modules cannot be downloaded)
// it is skipped too, or fails under CI (CI=true).
func helmBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds scripts/helmtemplate from Helm's packages; skipped with -short")
	}
	path, err := helmRenderer.build("../../scripts/helmtemplate", "helmtemplate")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return path
}

// helmTemplate renders the chart as release with the extra arguments and
// decodes the result strictly.
func helmTemplate(t *testing.T, helm, release string, args ...string) manifests {
	t.Helper()
	out, err := exec.Command(helm, append([]string{release, helmChart}, args...)...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("helm template %s %s: %v\n%s", release, strings.Join(args, " "), err, exit.Stderr)
		}
		t.Fatalf("helm template: %v", err)
	}
	return decodeManifests(t, "helm template "+release, out)
}

// helmRun renders the chart as release with args and returns what the
// renderer printed.
func helmRun(helm, release string, args ...string) (string, error) {
	out, err := exec.Command(helm, append([]string{release, helmChart}, args...)...).CombinedOutput()
	return string(out), err
}

// podLabelsOf is the labels of the pods of the StatefulSet among docs.
func podLabelsOf(t *testing.T, docs manifests) map[string]string {
	t.Helper()
	return one[*appsv1.StatefulSet](t, docs, "").Spec.Template.Labels
}

// sameInSubstance checks that got holds the objects of want (by kind and
// name) with the same content, once labels (each set labels its objects
// its own way: the chart adds the release), label selectors that select
// the pods (wantPods' or gotPods' labels, or some of them), and the image
// are set aside.
func sameInSubstance(t *testing.T, want, got manifests, wantPods, gotPods map[string]string) {
	t.Helper()
	w, g := substance(t, want, wantPods), substance(t, got, gotPods)
	for _, id := range slices.Sorted(maps.Keys(w)) {
		if _, ok := g[id]; !ok {
			t.Errorf("the chart renders no %s (the kustomize manifests have it)", id)
			continue
		}
		var diffs []string
		diff(id, w[id], g[id], &diffs)
		for _, d := range diffs {
			t.Errorf("chart and kustomize manifests differ: %s", d)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(g)) {
		if _, ok := w[id]; !ok {
			t.Errorf("the chart renders %s, which the kustomize manifests do not have", id)
		}
	}
}

// podsMarker stands for a set of labels that selects the pods.
const podsMarker = "<the pods' labels>"

// substance maps "Kind name" to the object as plain JSON values, with
// what sameInSubstance sets aside removed.
func substance(t *testing.T, docs manifests, podLabels map[string]string) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, d := range docs {
		b, err := json.Marshal(d.obj)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		kind := strings.TrimPrefix(fmt.Sprintf("%T", d.obj), "*")
		if meta, ok := m["metadata"].(map[string]any); ok {
			delete(meta, "labels")
		}
		if md, ok := m["Metadata"].(map[string]any); ok { // the ServiceMonitor's struct
			delete(md, "labels")
		}
		out[kind+" "+d.obj.GetName()] = normalize(m, podLabels)
	}
	return out
}

// normalize replaces label sets that select the pods (a subset of their
// labels) with podsMarker, drops any other "labels", and drops images.
func normalize(v any, podLabels map[string]string) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "image" {
				delete(v, k)
				continue
			}
			if labels, ok := e.(map[string]any); ok && (k == "labels" || k == "matchLabels" || k == "selector") {
				sel := map[string]string{}
				for lk, lv := range labels {
					s, _ := lv.(string)
					sel[lk] = s
				}
				if len(sel) == len(labels) && subset(sel, podLabels) {
					v[k] = podsMarker
					continue
				}
				if k == "labels" {
					delete(v, k)
					continue
				}
			}
			v[k] = normalize(e, podLabels)
		}
	case []any:
		for i := range v {
			v[i] = normalize(v[i], podLabels)
		}
	}
	return v
}

// diff appends to out a line for each place where want and got differ.
func diff(path string, want, got any, out *[]string) {
	if len(*out) >= 20 {
		return
	}
	wm, wok := want.(map[string]any)
	gm, gok := got.(map[string]any)
	if wok && gok {
		keys := slices.Collect(maps.Keys(wm))
		for k := range gm {
			if _, ok := wm[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			diff(path+"."+k, wm[k], gm[k], out)
		}
		return
	}
	wl, wok := want.([]any)
	gl, gok := got.([]any)
	if wok && gok && len(wl) == len(gl) {
		for i := range wl {
			diff(fmt.Sprintf("%s[%d]", path, i), wl[i], gl[i], out)
		}
		return
	}
	if !reflect.DeepEqual(want, got) {
		w, _ := json.Marshal(want)
		g, _ := json.Marshal(got)
		*out = append(*out, fmt.Sprintf("%s: kustomize %s, chart %s", path, w, g))
	}
}
