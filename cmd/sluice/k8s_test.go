package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// k8sDir holds the Kubernetes manifests, from this package's directory.
const k8sDir = "../../scripts/k8s"

// leaveMargin is what a graceful stop may take beyond --shutdown-timeout:
// announcing the leave and the leave itself each wait up to 2 s for
// gossip, then the data file is flushed.
const leaveMargin = 10 * time.Second

// TestKubernetesManifests: the manifests in scripts/k8s parse, and agree
// with the binary and with one another: the container runs "sluice serve"
// with flags and SLUICE_* variables serve really has, with values it
// accepts; every port the flags name is a container port and is what the
// Services and probes use; the probes ask grpc health on the gRPC port; the
// join address is the headless Service, which publishes not-ready pods and
// carries gossip over TCP and UDP; the grace period outlasts a graceful
// stop; the data volume is mounted at --data-dir.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	docs, files := loadManifests(t)

	t.Run("kustomization", func(t *testing.T) {
		k := docs.get(t, "Kustomization", "")
		var listed []string
		for _, r := range k.list(t, "resources") {
			listed = append(listed, r.(string))
		}
		var want []string
		for _, f := range files {
			if f != "kustomization.yaml" && !strings.HasSuffix(f, ".example.yaml") {
				want = append(want, f)
			}
		}
		slices.Sort(listed)
		if !slices.Equal(listed, want) {
			t.Errorf("kustomization.yaml resources = %v; want every manifest but the examples: %v", listed, want)
		}
	})

	sts := docs.get(t, "StatefulSet", "sluice")
	pod := sts.obj(t, "spec", "template", "spec")
	c := container(t, pod, "sluice")
	podLabels := sts.obj(t, "spec", "template", "metadata", "labels")
	fs := serveFlags(t, c)
	addr := func(flag string) int {
		t.Helper()
		v := fs.Lookup(flag).Value.String()
		_, p, err := net.SplitHostPort(v)
		n, err2 := strconv.Atoi(p)
		if err != nil || err2 != nil {
			t.Fatalf("--%s=%s: want host:port", flag, v)
		}
		return n
	}
	grpcPort, httpPort, gossipPort := addr("grpc-addr"), addr("http-addr"), addr("gossip-addr")
	if fs.Lookup("gossip-addr").Value.String() == "" || fs.Lookup("join").Value.String() == "" {
		t.Fatalf("container args set no --gossip-addr or --join: the pods would not form a cluster")
	}
	ports := containerPorts(t, c)

	t.Run("container ports", func(t *testing.T) {
		for _, p := range []struct {
			flag     string
			port     int
			protocol string
		}{
			{"grpc-addr", grpcPort, "TCP"},
			{"http-addr", httpPort, "TCP"},
			{"gossip-addr", gossipPort, "TCP"},
			{"gossip-addr", gossipPort, "UDP"},
		} {
			if !slices.ContainsFunc(ports, func(cp containerPort) bool { return cp.port == p.port && cp.protocol == p.protocol }) {
				t.Errorf("--%s listens on %s %d; the container ports %v do not expose it", p.flag, p.protocol, p.port, ports)
			}
		}
		if adv := fs.Lookup("advertise-addr").Value.String(); adv != "" {
			if n := addr("advertise-addr"); n != gossipPort {
				t.Errorf("--advertise-addr port %d differs from --gossip-addr port %d: peers would gossip to a port nothing listens on", n, gossipPort)
			}
		}
	})

	t.Run("probes", func(t *testing.T) {
		// Readiness follows grpc health, which is SERVING only while the
		// node holds a lease and its gained keys arrived. Liveness and startup
		// must not: a node without quorum (a minority side, a cluster
		// starting) is alive, and restarting it would not help.
		if probe, ok := c["readinessProbe"].(map[string]any); !ok {
			t.Errorf("container has no readinessProbe")
		} else {
			got, ok := dig(probe, "grpc", "port").(int)
			if !ok || got != grpcPort {
				t.Errorf("readinessProbe = %v; want a grpc probe (grpc health) on port %d, the port of --grpc-addr", probe, grpcPort)
			}
			if svc, ok := dig(probe, "grpc", "service").(string); ok && svc != "" {
				t.Errorf("readinessProbe asks grpc health for service %q; the node reports its health under \"\"", svc)
			}
		}
		for _, name := range []string{"livenessProbe", "startupProbe"} {
			probe, ok := c[name].(map[string]any)
			if !ok {
				t.Errorf("container has no %s", name)
				continue
			}
			path, _ := dig(probe, "httpGet", "path").(string)
			port, _ := dig(probe, "httpGet", "port").(int)
			if path != "/healthz" || port != httpPort {
				t.Errorf("%s = %v; want GET /healthz on port %d, the port of --http-addr (not grpc health: it says whether the node may decide, not whether it is alive)", name, probe, httpPort)
			}
		}
	})

	t.Run("expect", func(t *testing.T) {
		replicas, _ := dig(sts.m, "spec", "replicas").(int)
		if got := fs.Lookup("expect").Value.String(); got != strconv.Itoa(replicas) {
			t.Errorf("--expect=%s; want the StatefulSet's replicas, %d (scale both together)", got, replicas)
		}
	})

	t.Run("grace period", func(t *testing.T) {
		timeout, err := parseDuration(fs.Lookup("shutdown-timeout").Value.String())
		if err != nil {
			t.Fatal(err)
		}
		grace, ok := pod["terminationGracePeriodSeconds"].(int)
		if want := timeout + leaveMargin; !ok || time.Duration(grace)*time.Second <= want {
			t.Errorf("terminationGracePeriodSeconds = %v; want more than --shutdown-timeout %v + %v of leaving, or the kubelet kills nodes mid-handoff",
				pod["terminationGracePeriodSeconds"], timeout, leaveMargin)
		}
	})

	t.Run("data volume", func(t *testing.T) {
		dataDir := fs.Lookup("data-dir").Value.String()
		claims := map[string]bool{}
		for _, vc := range sts.list(t, "spec", "volumeClaimTemplates") {
			claims[dig(vc, "metadata", "name").(string)] = true
		}
		var mounts []string
		for _, m := range listAt(c, "volumeMounts") {
			if claims[dig(m, "name").(string)] {
				mounts = append(mounts, dig(m, "mountPath").(string))
			}
		}
		if len(mounts) != 1 || filepath.Clean(mounts[0]) != filepath.Clean(dataDir) {
			t.Errorf("volume claim mounts at %v; want one, at --data-dir %s", mounts, dataDir)
		}
	})

	t.Run("statefulset", func(t *testing.T) {
		if got := sts.str("spec", "podManagementPolicy"); got != "Parallel" {
			t.Errorf("podManagementPolicy = %q; want Parallel", got)
		}
		if !subset(sts.obj(t, "spec", "selector", "matchLabels"), podLabels) {
			t.Errorf("selector %v does not match the pod labels %v", sts.obj(t, "spec", "selector"), podLabels)
		}
		nonRoot := dig(pod, "securityContext", "runAsNonRoot") == true || dig(c, "securityContext", "runAsNonRoot") == true
		if !nonRoot || dig(c, "securityContext", "readOnlyRootFilesystem") != true {
			t.Errorf("securityContext: runAsNonRoot %v, readOnlyRootFilesystem %v; want both true", nonRoot, dig(c, "securityContext", "readOnlyRootFilesystem"))
		}
		for _, r := range []string{"requests", "limits"} {
			if _, ok := dig(c, "resources", r).(map[string]any); !ok {
				t.Errorf("container has no resource %s", r)
			}
		}
		if _, ok := c["command"]; !ok {
			b, err := os.ReadFile(filepath.Join(k8sDir, "Dockerfile"))
			if err != nil || !strings.Contains(string(b), `ENTRYPOINT ["/sluice"]`) {
				t.Errorf("the container sets no command, so the image's entrypoint must be the sluice binary; Dockerfile: %v", err)
			}
		}
	})

	headlessName := sts.str("spec", "serviceName")
	t.Run("services", func(t *testing.T) {
		for _, d := range docs {
			if d.kind() != "Service" {
				continue
			}
			svc := d
			if !subset(svc.obj(t, "spec", "selector"), podLabels) {
				t.Errorf("Service %s selects %v; the pods carry %v", svc.name(), svc.obj(t, "spec", "selector"), podLabels)
			}
			for _, p := range svc.list(t, "spec", "ports") {
				if _, ok := targetPort(p.(map[string]any), ports); !ok {
					t.Errorf("Service %s port %v targets no container port of %v", svc.name(), p, ports)
				}
			}
		}
		headless := docs.get(t, "Service", headlessName)
		if headless.str("spec", "clusterIP") != "None" || dig(headless.m, "spec", "publishNotReadyAddresses") != true {
			t.Errorf("Service %s (the StatefulSet's serviceName): clusterIP %q, publishNotReadyAddresses %v; want None and true, so that pods find one another before they are ready",
				headlessName, headless.str("spec", "clusterIP"), dig(headless.m, "spec", "publishNotReadyAddresses"))
		}
		for _, want := range []containerPort{{port: gossipPort, protocol: "TCP"}, {port: gossipPort, protocol: "UDP"}, {port: grpcPort, protocol: "TCP"}} {
			if !servesPort(t, headless, ports, want) {
				t.Errorf("Service %s exposes no %s port to container port %d", headlessName, want.protocol, want.port)
			}
		}
		client := docs.get(t, "Service", "sluice")
		for _, want := range []containerPort{{port: grpcPort, protocol: "TCP"}, {port: httpPort, protocol: "TCP"}} {
			if !servesPort(t, client, ports, want) {
				t.Errorf("Service sluice exposes no %s port to container port %d", want.protocol, want.port)
			}
		}
	})

	t.Run("join", func(t *testing.T) {
		for _, j := range strings.Split(fs.Lookup("join").Value.String(), ",") {
			host, port, err := net.SplitHostPort(strings.TrimSpace(j))
			if err != nil {
				t.Errorf("--join entry %q: want host:port", j)
				continue
			}
			// A headless Service's name resolves to the pods' own IPs: the
			// port is the container's, not a Service port.
			if label, _, _ := strings.Cut(host, "."); label != headlessName || port != strconv.Itoa(gossipPort) {
				t.Errorf("--join entry %q; want the headless Service %s on the gossip port %d", j, headlessName, gossipPort)
			}
		}
	})

	t.Run("pod disruption budget", func(t *testing.T) {
		pdb := docs.get(t, "PodDisruptionBudget", "sluice")
		if got := dig(pdb.m, "spec", "maxUnavailable"); got != 1 {
			t.Errorf("PodDisruptionBudget maxUnavailable = %v; want 1", got)
		}
		if !subset(pdb.obj(t, "spec", "selector", "matchLabels"), podLabels) {
			t.Errorf("PodDisruptionBudget selects %v; the pods carry %v", pdb.obj(t, "spec", "selector"), podLabels)
		}
	})

	t.Run("secrets", func(t *testing.T) {
		for _, e := range listAt(c, "env") {
			ref, ok := dig(e, "valueFrom", "secretKeyRef").(map[string]any)
			if !ok {
				continue
			}
			secret := docs.get(t, "Secret", ref["name"].(string))
			key := ref["key"].(string)
			if dig(secret.m, "stringData", key) == nil && dig(secret.m, "data", key) == nil {
				t.Errorf("env %v reads key %q of Secret %s (%s), which has no such key", dig(e, "name"), key, secret.name(), secret.file)
			}
			// The admin token is required (a node serving its peer service
			// on 0.0.0.0 refuses to start without it); the others are not.
			if required := dig(e, "name") == "SLUICE_ADMIN_TOKEN"; required == (ref["optional"] == true) {
				t.Errorf("env %v: secretKeyRef optional is %v; want %v", dig(e, "name"), ref["optional"], !required)
			}
		}
	})
}

// serveFlags checks the container's args and SLUICE_* variables against
// the flags of "sluice serve" and returns serve's flags set from them, as
// the node would see them in a pod (with sample values for the variables
// the args refer to).
func serveFlags(t *testing.T, c map[string]any) *pflag.FlagSet {
	t.Helper()
	cl := &cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	fs := cl.serveCommand().Flags()

	env := map[string]map[string]any{}
	for _, e := range listAt(c, "env") {
		e := e.(map[string]any)
		env[e["name"].(string)] = e
	}
	// The kubelet expands $(VAR) from the container's env; an undefined
	// one stays as it is, which no flag would want.
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	sample := map[string]string{"POD_NAME": "sluice-0", "POD_IP": "10.1.2.3", "POD_NAMESPACE": "default"}
	args := listAt(c, "args")
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("container args %v; want serve and its flags", args)
	}
	for _, a := range args[1:] {
		arg := ref.ReplaceAllStringFunc(a.(string), func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			if env[name] == nil {
				t.Errorf("container arg %q refers to $(%s), which the container's env does not define", a, name)
			}
			if v, ok := sample[name]; ok {
				return v
			}
			return "x"
		})
		name, value, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !strings.HasPrefix(arg, "--") || !ok {
			t.Errorf("container arg %q: want --flag=value", a)
			continue
		}
		if fs.Lookup(name) == nil {
			t.Errorf("container arg %q: sluice serve has no flag --%s", a, name)
			continue
		}
		if err := fs.Set(name, value); err != nil {
			t.Errorf("container arg %q: sluice serve refuses it: %v", a, err)
		}
	}

	flagOf := map[string]string{} // SLUICE_* variable → flag
	fs.VisitAll(func(f *pflag.Flag) {
		if vars := f.Annotations[envAnnotation]; len(vars) > 0 {
			flagOf[vars[0]] = f.Name
		}
	})
	for name, e := range env {
		if !strings.HasPrefix(name, "SLUICE_") {
			continue
		}
		flag, ok := flagOf[name]
		if !ok {
			t.Errorf("container env %s: sluice serve has no flag that reads it", name)
			continue
		}
		if fs.Changed(flag) {
			t.Errorf("container env %s and arg --%s both set --%s; the arg silently wins", name, flag, flag)
			continue
		}
		if v, ok := e["value"].(string); ok {
			if err := fs.Set(flag, v); err != nil {
				t.Errorf("container env %s=%q: sluice serve refuses it for --%s: %v", name, v, flag, err)
			}
		}
	}
	return fs
}

type containerPort struct {
	name     string
	port     int
	protocol string
}

func containerPorts(t *testing.T, c map[string]any) []containerPort {
	t.Helper()
	var ports []containerPort
	for _, p := range listAt(c, "ports") {
		p := p.(map[string]any)
		cp := containerPort{protocol: "TCP"}
		cp.name, _ = p["name"].(string)
		cp.port, _ = p["containerPort"].(int)
		if proto, ok := p["protocol"].(string); ok {
			cp.protocol = proto
		}
		ports = append(ports, cp)
	}
	return ports
}

// targetPort resolves a Service port to the container port it sends to.
func targetPort(p map[string]any, ports []containerPort) (containerPort, bool) {
	protocol := "TCP"
	if s, ok := p["protocol"].(string); ok {
		protocol = s
	}
	target := p["targetPort"]
	if target == nil {
		target = p["port"]
	}
	for _, cp := range ports {
		if cp.protocol == protocol && (target == cp.name || target == cp.port) {
			return cp, true
		}
	}
	return containerPort{}, false
}

// servesPort reports whether svc has a port sending to the container port
// want (its port and protocol).
func servesPort(t *testing.T, svc manifest, ports []containerPort, want containerPort) bool {
	for _, p := range svc.list(t, "spec", "ports") {
		if cp, ok := targetPort(p.(map[string]any), ports); ok && cp.port == want.port && cp.protocol == want.protocol {
			return true
		}
	}
	return false
}

func container(t *testing.T, pod map[string]any, name string) map[string]any {
	t.Helper()
	for _, c := range listAt(pod, "containers") {
		if c := c.(map[string]any); c["name"] == name {
			return c
		}
	}
	t.Fatalf("the pod template has no container %q", name)
	return nil
}

// subset reports whether every label of sel is in labels (and sel has
// some).
func subset(sel, labels map[string]any) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// manifest is one YAML document of scripts/k8s.
type manifest struct {
	file string
	m    map[string]any
}

func (d manifest) kind() string { s, _ := d.m["kind"].(string); return s }
func (d manifest) name() string { s, _ := dig(d.m, "metadata", "name").(string); return s }

func (d manifest) obj(t *testing.T, path ...any) map[string]any {
	t.Helper()
	v, ok := dig(d.m, path...).(map[string]any)
	if !ok {
		t.Fatalf("%s %s (%s): %v is not a mapping", d.kind(), d.name(), d.file, path)
	}
	return v
}

func (d manifest) list(t *testing.T, path ...any) []any {
	t.Helper()
	v, ok := dig(d.m, path...).([]any)
	if !ok {
		t.Fatalf("%s %s (%s): %v is not a list", d.kind(), d.name(), d.file, path)
	}
	return v
}

func (d manifest) str(path ...any) string {
	s, _ := dig(d.m, path...).(string)
	return s
}

type manifests []manifest

// get returns the document of that kind and name (any name if empty).
func (ds manifests) get(t *testing.T, kind, name string) manifest {
	t.Helper()
	for _, d := range ds {
		if d.kind() == kind && (name == "" || d.name() == name) {
			return d
		}
	}
	t.Fatalf("scripts/k8s holds no %s %q", kind, name)
	return manifest{}
}

// loadManifests parses every YAML document of scripts/k8s/*.yaml and
// returns them with the file names, sorted.
func loadManifests(t *testing.T) (manifests, []string) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	var docs manifests
	var files []string
	for _, path := range paths {
		file := filepath.Base(path)
		files = append(files, file)
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for i := 0; ; i++ {
			var m map[string]any
			err := dec.Decode(&m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				t.Fatalf("%s, document %d: %v", file, i, err)
			}
			if m == nil {
				continue
			}
			d := manifest{file: file, m: m}
			if d.kind() == "" || (d.name() == "" && d.kind() != "Kustomization") || m["apiVersion"] == nil {
				t.Errorf("%s, document %d: want apiVersion, kind and metadata.name", file, i)
			}
			docs = append(docs, d)
		}
		f.Close()
	}
	return docs, files
}

// dig walks v through map keys (string) and list indexes (int); nil when
// the path does not exist.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		default:
			panic(fmt.Sprintf("dig: path element %v", p))
		}
	}
	return v
}

// listAt is the list at key of m, nil if there is none.
func listAt(m map[string]any, key string) []any {
	l, _ := m[key].([]any)
	return l
}
