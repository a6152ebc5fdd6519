package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/apitest"
)

// k8sDir holds the Kubernetes manifests, from this package's directory.
const k8sDir = "../../scripts/k8s"

// leaveMargin is what a graceful stop may take beyond --shutdown-timeout:
// announcing the leave and the leave itself each wait up to 2 s for
// gossip, then the data file is flushed.
const leaveMargin = 10 * time.Second

// TestKubernetesManifests: the manifests in scripts/k8s decode strictly
// into the Kubernetes API types (an unknown or misspelt field, or a key
// given twice, fails), and agree with the binary and with one another (see
// checkManifests). kustomization.yaml lists every manifest but the
// examples and those whose kinds need a CRD.
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	docs := loadManifestDir(t, k8sDir)

	t.Run("kustomization", func(t *testing.T) {
		k := one[*kustomization](t, docs, "")
		listed := slices.Sorted(slices.Values(k.Resources))
		var want []string
		for _, d := range docs {
			if d.file == "kustomization.yaml" || strings.HasSuffix(d.file, ".example.yaml") || !d.builtin {
				continue
			}
			if !slices.Contains(want, d.file) {
				want = append(want, d.file)
			}
		}
		slices.Sort(want)
		if !slices.Equal(listed, want) {
			t.Errorf("kustomization.yaml resources = %v; want every manifest of built-in kinds but the examples: %v", listed, want)
		}
	})

	checkManifests(t, docs)
}

// checkManifests checks one rendering of the manifests (scripts/k8s, or
// the Helm chart's output): the container runs "sluice serve" with flags
// and SLUICE_* variables serve really has, each set once, with values it
// accepts; the Go runtime's memory limit sits under the container's; every
// port the flags name is a container port and is what the Services and
// probes use; the probes ask the plain-HTTP health listener (readiness
// /readyz); the pods are spread one per machine and across zones; the
// NetworkPolicy opens each port to those who need it; the join
// address is the headless Service, which publishes not-ready pods and
// carries gossip over TCP and UDP; the grace period outlasts a graceful
// stop; the data volume is mounted at --data-dir.
func checkManifests(t *testing.T, docs manifests) {
	sts := one[*appsv1.StatefulSet](t, docs, "")
	pod := &sts.Spec.Template.Spec
	c := container(t, pod, "sluice")
	podLabels := sts.Spec.Template.Labels
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
	ports := c.Ports

	t.Run("container ports", func(t *testing.T) {
		for _, p := range []struct {
			flag     string
			port     int
			protocol corev1.Protocol
		}{
			{"grpc-addr", grpcPort, corev1.ProtocolTCP},
			{"http-addr", httpPort, corev1.ProtocolTCP},
			{"gossip-addr", gossipPort, corev1.ProtocolTCP},
			{"gossip-addr", gossipPort, corev1.ProtocolUDP},
		} {
			if _, ok := resolvePort(intstr.FromInt(p.port), p.protocol, ports); !ok {
				t.Errorf("--%s listens on %s %d; the container ports %v do not expose it", p.flag, p.protocol, p.port, ports)
			}
		}
		if adv := fs.Lookup("advertise-addr").Value.String(); adv != "" {
			if n := addr("advertise-addr"); n != gossipPort {
				t.Errorf("--advertise-addr port %d differs from --gossip-addr port %d: peers would gossip to a port nothing listens on", n, gossipPort)
			}
		}
	})

	t.Run("go runtime", func(t *testing.T) {
		// The Go runtime's soft limit sits under the container's memory
		// limit, with room for what the runtime does not count (the data
		// file's mapped pages, the kernel's buffers), so that it collects
		// harder before the kernel kills the node: sluice sets it from
		// --memory-limit, which the downward API gives the container's
		// limit, so that it follows a change of resources. A literal
		// GOMEMLIMIT would override it, and must sit under the limit.
		limit := c.Resources.Limits.Memory()
		if limit.IsZero() {
			t.Errorf("container has no memory limit: the node's memory is not bounded")
		}
		if cpu := c.Resources.Limits.Cpu(); !cpu.IsZero() {
			t.Errorf("container has a CPU limit %v: it throttles a latency-critical node; request CPU instead", cpu)
		}
		var memLimit, goMemLimit *corev1.EnvVar
		for i, e := range c.Env {
			switch e.Name {
			case "SLUICE_MEMORY_LIMIT":
				memLimit = &c.Env[i]
			case "GOMEMLIMIT":
				goMemLimit = &c.Env[i]
			}
		}
		var ref *corev1.ResourceFieldSelector
		if memLimit != nil && memLimit.ValueFrom != nil {
			ref = memLimit.ValueFrom.ResourceFieldRef
		}
		if ref == nil || ref.Resource != "limits.memory" || cmp.Or(ref.ContainerName, c.Name) != c.Name || !ref.Divisor.IsZero() && ref.Divisor.Value() != 1 {
			t.Errorf("SLUICE_MEMORY_LIMIT = %v; want the container's limits.memory in bytes (resourceFieldRef)", memLimit)
		}
		if goMemLimit != nil {
			n, err := parseGoMemLimit(goMemLimit.Value)
			if lim := limit.Value(); goMemLimit.ValueFrom != nil || err != nil || n < lim/2 || n > lim*95/100 {
				t.Errorf("GOMEMLIMIT=%s (%v); want none, or between half and 95%% of the memory limit %v (%d bytes)", envText(*goMemLimit), err, limit, lim)
			}
		}
	})

	t.Run("probes", func(t *testing.T) {
		// The probes ask the health listener, which answers in plain HTTP
		// whatever the TLS settings (the kubelet can neither present a
		// client certificate nor speak TLS to a gRPC probe): readiness
		// /readyz, which says whether the node may decide (it holds a
		// lease and its gained keys arrived); liveness and startup
		// /healthz, which answers as long as the process serves, since a
		// node without quorum (a minority side, a cluster starting) is
		// alive and restarting it would not help.
		f := fs.Lookup("health-addr")
		if f == nil || f.Value.String() == "" {
			t.Fatalf("container args set no --health-addr: the probes would need the TLS ports")
		}
		healthPort := addr("health-addr")
		if _, ok := resolvePort(intstr.FromInt(healthPort), corev1.ProtocolTCP, ports); !ok {
			t.Errorf("--health-addr listens on %d; the container ports %v do not expose it", healthPort, ports)
		}
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{{"startupProbe", c.StartupProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
			if p.probe == nil {
				t.Errorf("container has no %s", p.name)
				continue
			}
			get := p.probe.HTTPGet
			ok := get != nil && get.Path == p.path && cmp.Or(get.Scheme, corev1.URISchemeHTTP) == corev1.URISchemeHTTP
			if ok {
				cp, found := resolvePort(get.Port, corev1.ProtocolTCP, ports)
				ok = found && int(cp.ContainerPort) == healthPort
			}
			if !ok {
				t.Errorf("%s = %s; want httpGet HTTP %s on port %d, the port of --health-addr", p.name, probeText(p.probe), p.path, healthPort)
			}
		}
	})

	t.Run("expect", func(t *testing.T) {
		// --expect bootstraps a new cluster: at most the replicas, or it
		// never forms, and more than half of them, or two groups of pods
		// could each form one. It is ignored once the cluster exists, so
		// it need not follow the replicas when they are scaled (and
		// changing it would restart every pod).
		replicas := int32(1)
		if sts.Spec.Replicas != nil {
			replicas = *sts.Spec.Replicas
		}
		if got, err := strconv.Atoi(fs.Lookup("expect").Value.String()); err != nil || 2*got <= int(replicas) || got > int(replicas) {
			t.Errorf("--expect=%s; want more than half of the StatefulSet's replicas, %d, and at most all of them", fs.Lookup("expect").Value, replicas)
		}
	})

	t.Run("grace period", func(t *testing.T) {
		timeout, err := parseDuration(fs.Lookup("shutdown-timeout").Value.String())
		if err != nil {
			t.Fatal(err)
		}
		grace := pod.TerminationGracePeriodSeconds
		if want := timeout + leaveMargin; grace == nil || time.Duration(*grace)*time.Second <= want {
			t.Errorf("terminationGracePeriodSeconds = %v; want more than --shutdown-timeout %v + %v of leaving, or the kubelet kills nodes mid-handoff",
				grace, timeout, leaveMargin)
		}
	})

	t.Run("data volume", func(t *testing.T) {
		dataDir := fs.Lookup("data-dir").Value.String()
		claims := map[string]bool{}
		for _, vc := range sts.Spec.VolumeClaimTemplates {
			claims[vc.Name] = true
		}
		var mounts []string
		for _, m := range c.VolumeMounts {
			if claims[m.Name] {
				mounts = append(mounts, m.MountPath)
			}
		}
		if len(mounts) != 1 || filepath.Clean(mounts[0]) != filepath.Clean(dataDir) {
			t.Errorf("volume claim mounts at %v; want one, at --data-dir %s", mounts, dataDir)
		}
	})

	t.Run("statefulset", func(t *testing.T) {
		if got := sts.Spec.PodManagementPolicy; got != appsv1.ParallelPodManagement {
			t.Errorf("podManagementPolicy = %q; want Parallel", got)
		}
		if sts.Spec.Selector == nil || !subset(sts.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("selector %v does not match the pod labels %v", sts.Spec.Selector, podLabels)
		}
		nonRoot := pod.SecurityContext != nil && isTrue(pod.SecurityContext.RunAsNonRoot) ||
			c.SecurityContext != nil && isTrue(c.SecurityContext.RunAsNonRoot)
		readOnly := c.SecurityContext != nil && isTrue(c.SecurityContext.ReadOnlyRootFilesystem)
		if !nonRoot || !readOnly {
			t.Errorf("securityContext: runAsNonRoot %v, readOnlyRootFilesystem %v; want both true", nonRoot, readOnly)
		}
		if len(c.Resources.Requests) == 0 || len(c.Resources.Limits) == 0 {
			t.Errorf("container resources %v; want requests and limits", c.Resources)
		}
		if len(c.Command) == 0 {
			b, err := os.ReadFile(filepath.Join(k8sDir, "Dockerfile"))
			if err != nil || !strings.Contains(string(b), `ENTRYPOINT ["/sluice"]`) {
				t.Errorf("the container sets no command, so the image's entrypoint must be the sluice binary; Dockerfile: %v", err)
			}
		}
	})

	headlessName := sts.Spec.ServiceName
	t.Run("services", func(t *testing.T) {
		var client *corev1.Service
		for _, svc := range all[*corev1.Service](docs) {
			if !subset(svc.Spec.Selector, podLabels) {
				t.Errorf("Service %s selects %v; the pods carry %v", svc.Name, svc.Spec.Selector, podLabels)
			}
			for _, p := range svc.Spec.Ports {
				if _, ok := serviceTarget(p, ports); !ok {
					t.Errorf("Service %s port %s (%v) targets no container port of %v", svc.Name, p.Name, p.TargetPort.String(), ports)
				}
			}
			if svc.Name != headlessName {
				client = svc
			}
		}
		headless := one[*corev1.Service](t, docs, headlessName)
		if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s (the StatefulSet's serviceName): clusterIP %q, publishNotReadyAddresses %v; want None and true, so that pods find one another before they are ready",
				headlessName, headless.Spec.ClusterIP, headless.Spec.PublishNotReadyAddresses)
		}
		for _, want := range []corev1.ContainerPort{{ContainerPort: int32(gossipPort), Protocol: corev1.ProtocolTCP}, {ContainerPort: int32(gossipPort), Protocol: corev1.ProtocolUDP}, {ContainerPort: int32(grpcPort), Protocol: corev1.ProtocolTCP}} {
			if !servesPort(headless, ports, want) {
				t.Errorf("Service %s exposes no %s port to container port %d", headlessName, want.Protocol, want.ContainerPort)
			}
		}
		if client == nil {
			t.Fatalf("no Service for the clients besides the headless %s", headlessName)
		}
		for _, want := range []corev1.ContainerPort{{ContainerPort: int32(grpcPort), Protocol: corev1.ProtocolTCP}, {ContainerPort: int32(httpPort), Protocol: corev1.ProtocolTCP}} {
			if !servesPort(client, ports, want) {
				t.Errorf("Service %s exposes no %s port to container port %d", client.Name, want.Protocol, want.ContainerPort)
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
		pdb := one[*policyv1.PodDisruptionBudget](t, docs, "")
		if got := pdb.Spec.MaxUnavailable; got == nil || *got != intstr.FromInt(1) {
			t.Errorf("PodDisruptionBudget maxUnavailable = %v; want 1", got)
		}
		if pdb.Spec.Selector == nil || !subset(pdb.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("PodDisruptionBudget selects %v; the pods carry %v", pdb.Spec.Selector, podLabels)
		}
	})

	t.Run("scheduling", func(t *testing.T) {
		// One pod per machine, required: a machine that fails costs one
		// node. Spread over zones where there are zones, preferred only:
		// nodes without a zone label, or a zone down, must not leave pods
		// pending.
		var perHost bool
		if a := pod.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				perHost = perHost || term.TopologyKey == corev1.LabelHostname && selectsPods(term.LabelSelector, podLabels)
			}
		}
		if !perHost {
			t.Errorf("no required pod anti-affinity on %s selecting the pods %v: two nodes could share a machine", corev1.LabelHostname, podLabels)
		}
		var zones bool
		for _, c := range pod.TopologySpreadConstraints {
			if c.TopologyKey == corev1.LabelTopologyZone && selectsPods(c.LabelSelector, podLabels) {
				zones = true
				if c.WhenUnsatisfiable != corev1.ScheduleAnyway || c.MaxSkew != 1 {
					t.Errorf("zone spread: whenUnsatisfiable %s, maxSkew %d; want ScheduleAnyway and 1 (a cluster without zones must still schedule)", c.WhenUnsatisfiable, c.MaxSkew)
				}
			}
		}
		if !zones {
			t.Errorf("topologySpreadConstraints %+v; want one on %s selecting the pods", pod.TopologySpreadConstraints, corev1.LabelTopologyZone)
		}
		if a := pod.AutomountServiceAccountToken; a == nil || *a {
			t.Errorf("automountServiceAccountToken = %v; want false (a node never calls the Kubernetes API)", a)
		}
	})

	t.Run("network policy", func(t *testing.T) {
		policy := one[*networkingv1.NetworkPolicy](t, docs, "")
		l := listeners{grpc: grpcPort, peer: grpcPort, admin: grpcPort, http: httpPort, gossip: gossipPort}
		for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
			if p != nil && p.HTTPGet != nil {
				if cp, ok := resolvePort(p.HTTPGet.Port, corev1.ProtocolTCP, ports); ok {
					l.probes = append(l.probes, int(cp.ContainerPort))
				}
			}
		}
		if v := fs.Lookup("peer-addr").Value.String(); v != "" {
			l.peer = addr("peer-addr")
		}
		if v := fs.Lookup("admin-addr").Value.String(); v != "" {
			l.admin = addr("admin-addr")
		}
		checkNetworkPolicy(t, policy, podLabels, ports, l)
	})

	t.Run("service monitor", func(t *testing.T) {
		sm, ok := find[*serviceMonitor](docs, "")
		if !ok {
			t.Skip("no ServiceMonitor among these manifests")
		}
		if len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s has endpoints %+v; want one", sm.GetName(), sm.Spec.Endpoints)
		}
		ep := sm.Spec.Endpoints[0]
		var targets []string
		for _, svc := range all[*corev1.Service](docs) {
			if !selectsPods(&sm.Spec.Selector, svc.Labels) {
				continue
			}
			for _, p := range svc.Spec.Ports {
				if p.Name != ep.Port {
					continue
				}
				if cp, ok := serviceTarget(p, ports); !ok || int(cp.ContainerPort) != httpPort {
					t.Errorf("ServiceMonitor port %q is Service %s's port to %v; want the port of --http-addr, %d", ep.Port, svc.Name, p.TargetPort.String(), httpPort)
				}
				targets = append(targets, svc.Name)
			}
		}
		if len(targets) != 1 {
			t.Errorf("ServiceMonitor %s scrapes port %q of Services %v; want exactly one (each pod scraped once)", sm.GetName(), ep.Port, targets)
		}
		if ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor path %q; want /metrics", ep.Path)
		}
	})

	t.Run("files", func(t *testing.T) {
		// A file a flag names is in a volume mounted read-only at its
		// directory; a ConfigMap among the manifests holds it, and so does
		// a Secret when it is among them (cert-manager's is not).
		volumes := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			volumes[v.Name] = v
		}
		for _, flag := range []string{"tls-cert", "tls-key", "tls-client-ca", "limits-file"} {
			path := fs.Lookup(flag).Value.String()
			if path == "" {
				continue
			}
			dir, key := filepath.Dir(path), filepath.Base(path)
			if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == filepath.Clean(path) }) {
				dir, key = filepath.Clean(path), "" // a directory: the volume's every key
			}
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == dir })
			if i < 0 {
				t.Errorf("--%s=%s: no volume is mounted at %s", flag, path, dir)
				continue
			}
			m := c.VolumeMounts[i]
			v, ok := volumes[m.Name]
			switch {
			case !ok:
				t.Errorf("--%s=%s: the pod has no volume %q", flag, path, m.Name)
			case !m.ReadOnly:
				t.Errorf("--%s=%s: volume %q is mounted writable; want readOnly", flag, path, m.Name)
			case v.ConfigMap != nil:
				if cm, ok := find[*corev1.ConfigMap](docs, v.ConfigMap.Name); !ok {
					t.Errorf("--%s=%s: ConfigMap %s is not among the manifests", flag, path, v.ConfigMap.Name)
				} else if _, ok := cm.Data[key]; !ok && (key != "" || len(cm.Data) == 0) {
					t.Errorf("--%s=%s: ConfigMap %s has no key %q", flag, path, cm.Name, key)
				}
			case v.Secret != nil:
				if sec, ok := find[*corev1.Secret](docs, v.Secret.SecretName); ok {
					_, inString := sec.StringData[key]
					_, inData := sec.Data[key]
					if !inString && !inData {
						t.Errorf("--%s=%s: Secret %s has no key %q", flag, path, sec.Name, key)
					}
				}
			default:
				t.Errorf("--%s=%s: volume %q is neither a Secret nor a ConfigMap", flag, path, m.Name)
			}
		}
	})

	t.Run("secrets", func(t *testing.T) {
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			// The Secret may be the operator's own (not among the
			// manifests); when it is here, it has the key.
			if secret, ok := find[*corev1.Secret](docs, ref.Name); ok {
				_, inString := secret.StringData[ref.Key]
				_, inData := secret.Data[ref.Key]
				if !inString && !inData {
					t.Errorf("env %s reads key %q of Secret %s, which has no such key", e.Name, ref.Key, secret.Name)
				}
			}
			// The admin token is required (a node serving its peer service
			// on 0.0.0.0 refuses to start without it); the others are not.
			if required := e.Name == "SLUICE_ADMIN_TOKEN"; required == isTrue(ref.Optional) {
				t.Errorf("env %s: secretKeyRef optional is %v; want %v", e.Name, isTrue(ref.Optional), !required)
			}
		}
	})
}

// serveFlags checks the container's args and SLUICE_* variables against
// the flags of "sluice serve" and returns serve's flags set from them, as
// the node would see them in a pod (with sample values for the variables
// the args refer to). A variable or flag given twice is an error: the
// kubelet keeps the last variable of a name and the flags the last value,
// so the first is dead text that a reader believes.
func serveFlags(t *testing.T, c *corev1.Container) *pflag.FlagSet {
	t.Helper()
	cl := &cli{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	fs := cl.serveCommand().Flags()

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if prev, ok := env[e.Name]; ok {
			t.Errorf("container env %s is set twice (%s, then %s); the kubelet keeps the last one", e.Name, envText(prev), envText(e))
		}
		env[e.Name] = e
	}
	// The kubelet expands $(VAR) from the container's env; an undefined
	// one stays as it is, which no flag would want.
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	sample := map[string]string{"POD_NAME": "sluice-0", "POD_IP": "10.1.2.3", "POD_NAMESPACE": "default"}
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("container args %v; want serve and its flags", c.Args)
	}
	seen := map[string]string{}
	for _, a := range c.Args[1:] {
		arg := ref.ReplaceAllStringFunc(a, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			if _, ok := env[name]; !ok {
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
		if prev, ok := seen[name]; ok {
			t.Errorf("container args set --%s twice (%q, then %q); the last one wins", name, prev, a)
		}
		seen[name] = a
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
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range env {
			if !yield(n) {
				return
			}
		}
	}) {
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
		if e := env[name]; e.ValueFrom == nil {
			if err := fs.Set(flag, e.Value); err != nil {
				t.Errorf("container env %s=%q: sluice serve refuses it for --%s: %v", name, e.Value, flag, err)
			}
		}
	}
	return fs
}

// listeners are the ports a node listens on (peer and admin are grpc's
// unless they have listeners of their own).
type listeners struct {
	grpc, peer, admin, http, gossip int
	// probes are the ports the kubelet's probes ask.
	probes []int
}

// checkNetworkPolicy checks that policy lets each port be reached by
// those who need it and no one else: gossip by the pods only; the peer and
// admin services by the pods (forwarded checks, handoffs, leases, admin
// calls fanned out), the decision port by clients too; metrics by a
// namespace (Prometheus'), not everyone; the probes' ports by everyone
// (the kubelet's traffic comes from the node, which no selector names).
func checkNetworkPolicy(t *testing.T, policy *networkingv1.NetworkPolicy, podLabels map[string]string, ports []corev1.ContainerPort, l listeners) {
	t.Helper()
	if !selectsPods(&policy.Spec.PodSelector, podLabels) {
		t.Errorf("NetworkPolicy %s selects %v; the pods carry %v", policy.Name, policy.Spec.PodSelector, podLabels)
	}
	if !slices.Contains(policy.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s policyTypes %v; want Ingress", policy.Name, policy.Spec.PolicyTypes)
	}
	for i, rule := range policy.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil {
				continue
			}
			if _, ok := resolvePort(*p.Port, ptrOr(p.Protocol, corev1.ProtocolTCP), ports); !ok {
				t.Errorf("NetworkPolicy %s, ingress rule %d: port %s %s is no container port of %v", policy.Name, i, ptrOr(p.Protocol, corev1.ProtocolTCP), p.Port.String(), ports)
			}
		}
	}
	get := func(port int, protocol corev1.Protocol) reach {
		return policyReach(policy, podLabels, ports, port, protocol)
	}
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		if r := get(l.gossip, proto); !r.pods || r.everyone || len(r.namespaces) > 0 || r.other {
			t.Errorf("gossip %s %d is reachable by %+v; want the pods only", proto, l.gossip, r)
		}
	}
	for _, s := range []struct {
		what string
		port int
	}{{"the peer service", l.peer}, {"the admin service (admin calls fan out)", l.admin}} {
		if r := get(s.port, corev1.ProtocolTCP); !r.pods && !r.everyone {
			t.Errorf("%s on %d is reachable by %+v; want the pods among them", s.what, s.port, r)
		}
	}
	if l.peer != l.grpc {
		if r := get(l.peer, corev1.ProtocolTCP); r.everyone || len(r.namespaces) > 0 || r.other {
			t.Errorf("the peer service on its own port %d is reachable by %+v; want the pods only", l.peer, r)
		}
	}
	if r := get(l.grpc, corev1.ProtocolTCP); !r.everyone && len(r.namespaces) == 0 && !r.other {
		t.Errorf("the decision port %d is reachable by %+v; want the clients too", l.grpc, r)
	}
	if r := get(l.http, corev1.ProtocolTCP); r.everyone || len(r.namespaces) == 0 {
		t.Errorf("metrics on %d are reachable by %+v; want a namespace (Prometheus'), not everyone", l.http, r)
	}
	for _, p := range l.probes {
		if r := get(p, corev1.ProtocolTCP); !r.everyone {
			t.Errorf("the probes' port %d is reachable by %+v; want everyone (the kubelet's traffic comes from the node)", p, r)
		}
	}
}

// reach is who a NetworkPolicy lets reach a port.
type reach struct {
	everyone   bool     // any source
	pods       bool     // the Sluice pods
	namespaces []string // the pods of these namespaces (by kubernetes.io/metadata.name)
	other      bool     // some other source (other pods, an IP block)
}

// policyReach says who policy lets reach port/protocol of the pods it
// selects.
func policyReach(policy *networkingv1.NetworkPolicy, podLabels map[string]string, ports []corev1.ContainerPort, port int, protocol corev1.Protocol) reach {
	var r reach
	for _, rule := range policy.Spec.Ingress {
		match := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			if ptrOr(p.Protocol, corev1.ProtocolTCP) != protocol {
				continue
			}
			if p.Port == nil {
				match = true
				continue
			}
			cp, ok := resolvePort(*p.Port, protocol, ports)
			end := cp.ContainerPort
			if p.EndPort != nil {
				end = *p.EndPort
			}
			match = match || ok && int(cp.ContainerPort) <= port && port <= int(end)
		}
		if !match {
			continue
		}
		if len(rule.From) == 0 {
			r.everyone = true
		}
		for _, from := range rule.From {
			switch {
			case from.IPBlock != nil:
				r.other = true
			case from.NamespaceSelector == nil && from.PodSelector != nil:
				if selectsPods(from.PodSelector, podLabels) {
					r.pods = true
				} else {
					r.other = true
				}
			case from.PodSelector == nil && from.NamespaceSelector != nil:
				ns := from.NamespaceSelector
				name, ok := ns.MatchLabels[corev1.LabelMetadataName]
				switch {
				case len(ns.MatchLabels) == 0 && len(ns.MatchExpressions) == 0:
					r.everyone = true // every namespace's pods
				case ok && len(ns.MatchLabels) == 1 && len(ns.MatchExpressions) == 0:
					r.namespaces = append(r.namespaces, name)
				default:
					r.other = true
				}
			default:
				r.other = true
			}
		}
	}
	return r
}

// selectsPods reports whether sel (matchLabels only) selects pods that
// carry labels.
func selectsPods(sel *metav1.LabelSelector, labels map[string]string) bool {
	return sel != nil && len(sel.MatchExpressions) == 0 && subset(sel.MatchLabels, labels)
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// TestSecurityDocNetworkPolicy: the NetworkPolicy docs/security.md shows,
// for nodes whose peer and admin services have ports of their own (8082,
// 8083) and whose probes ask --health-addr (8084), decodes strictly and lets each port be reached by those who need
// it (checkNetworkPolicy), like the one in scripts/k8s.
func TestSecurityDocNetworkPolicy(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if !strings.Contains(block[1], "kind: NetworkPolicy") {
			continue
		}
		found = true
		docs := decodeManifests(t, "docs/security.md", []byte(block[1]))
		policy := one[*networkingv1.NetworkPolicy](t, docs, "")
		ports := []corev1.ContainerPort{
			{Name: "grpc", ContainerPort: 8081}, {Name: "peer", ContainerPort: 8082}, {Name: "admin", ContainerPort: 8083},
			{Name: "http", ContainerPort: 8080}, {Name: "health", ContainerPort: 8084},
			{Name: "gossip-tcp", ContainerPort: 7946}, {Name: "gossip-udp", ContainerPort: 7946, Protocol: corev1.ProtocolUDP},
		}
		podLabels := map[string]string{"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "node"}
		checkNetworkPolicy(t, policy, podLabels, ports, listeners{grpc: 8081, peer: 8082, admin: 8083, http: 8080, gossip: 7946, probes: []int{8084}})
	}
	if !found {
		t.Fatal("docs/security.md shows no NetworkPolicy")
	}
}

// envText describes where a variable's value comes from.
func envText(e corev1.EnvVar) string {
	if e.ValueFrom == nil {
		return strconv.Quote(e.Value)
	}
	switch f := e.ValueFrom; {
	case f.FieldRef != nil:
		return "fieldRef " + f.FieldRef.FieldPath
	case f.ResourceFieldRef != nil:
		return "resourceFieldRef " + f.ResourceFieldRef.Resource
	case f.SecretKeyRef != nil:
		return "secret " + f.SecretKeyRef.Name + "/" + f.SecretKeyRef.Key
	case f.ConfigMapKeyRef != nil:
		return "config map " + f.ConfigMapKeyRef.Name + "/" + f.ConfigMapKeyRef.Key
	}
	return "valueFrom"
}

// parseGoMemLimit parses GOMEMLIMIT as the Go runtime does: a number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB.
func parseGoMemLimit(s string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("GOMEMLIMIT %q: want a number of bytes with an optional unit B, KiB, MiB, GiB or TiB", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	shift := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	return n << shift, nil
}

// resolvePort finds the container port that port (a number or a name)
// and protocol (empty is TCP) designate.
func resolvePort(port intstr.IntOrString, protocol corev1.Protocol, ports []corev1.ContainerPort) (corev1.ContainerPort, bool) {
	for _, cp := range ports {
		if cmpProtocol(cp.Protocol) != cmpProtocol(protocol) {
			continue
		}
		if port.Type == intstr.String && port.StrVal == cp.Name || port.Type == intstr.Int && port.IntVal == cp.ContainerPort {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

// cmpProtocol is p with its default, TCP.
func cmpProtocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// serviceTarget resolves a Service port to the container port it sends to.
func serviceTarget(p corev1.ServicePort, ports []corev1.ContainerPort) (corev1.ContainerPort, bool) {
	target := p.TargetPort
	if target == (intstr.IntOrString{}) {
		target = intstr.FromInt32(p.Port)
	}
	return resolvePort(target, p.Protocol, ports)
}

// servesPort reports whether svc has a port sending to the container port
// want (its port and protocol).
func servesPort(svc *corev1.Service, ports []corev1.ContainerPort, want corev1.ContainerPort) bool {
	for _, p := range svc.Spec.Ports {
		if cp, ok := serviceTarget(p, ports); ok && cp.ContainerPort == want.ContainerPort && cmpProtocol(cp.Protocol) == cmpProtocol(want.Protocol) {
			return true
		}
	}
	return false
}

func container(t *testing.T, pod *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range pod.Containers {
		if pod.Containers[i].Name == name {
			return &pod.Containers[i]
		}
	}
	t.Fatalf("the pod template has no container %q", name)
	return nil
}

// subset reports whether every label of sel is in labels (and sel has
// some).
func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if w, ok := labels[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func isTrue(b *bool) bool { return b != nil && *b }

// kustomization is the part of a kustomization.yaml the tests read;
// decoding it strictly refuses any other field.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// GetName: a kustomization has no name.
func (*kustomization) GetName() string { return "" }

// manifest is one YAML document: a Kubernetes API object (*appsv1.StatefulSet,
// *corev1.Service, ...), or one of the types above for the kinds the
// Kubernetes API does not have.
type manifest struct {
	file    string // the file it came from
	index   int    // its place in the file, from 0
	builtin bool   // a kind of the Kubernetes API itself, no CRD needed
	obj     interface{ GetName() string }
}

type manifests []manifest

// find returns the document of type T and that name (any name if empty).
func find[T interface{ GetName() string }](ds manifests, name string) (T, bool) {
	for _, d := range ds {
		if o, ok := d.obj.(T); ok && (name == "" || o.GetName() == name) {
			return o, true
		}
	}
	var zero T
	return zero, false
}

// one is find, failing the test when there is none.
func one[T interface{ GetName() string }](t *testing.T, ds manifests, name string) T {
	t.Helper()
	o, ok := find[T](ds, name)
	if !ok {
		t.Fatalf("the manifests hold no %T %q", o, name)
	}
	return o
}

// all returns every document of type T.
func all[T any](ds manifests) []T {
	var out []T
	for _, d := range ds {
		if o, ok := d.obj.(T); ok {
			out = append(out, o)
		}
	}
	return out
}

// loadManifestDir decodes every YAML document of dir/*.yaml.
func loadManifestDir(t *testing.T, dir string) manifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	var docs manifests
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, decodeManifests(t, filepath.Base(path), b)...)
	}
	return docs
}

// decodeManifests decodes the YAML documents of one file (or of a
// rendering) strictly: the kinds of the Kubernetes API into their Go
// types, a Kustomization and a ServiceMonitor into the structs above. An
// unknown field, a key given twice or an unknown kind fails the test.
func decodeManifests(t *testing.T, file string, data []byte) manifests {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var docs manifests
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s, document %d: %v", file, i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%s, document %d: %v", file, i, err)
		}
		if m == nil {
			i--
			continue // comments only
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s, document %d: %v", file, i, err)
		}
		d := manifest{file: file, index: i}
		switch tm.GroupVersionKind().GroupKind().String() {
		case "Kustomization.kustomize.config.k8s.io":
			k := &kustomization{}
			err, d.obj = yaml.UnmarshalStrict(doc, k), k
		case "ServiceMonitor.monitoring.coreos.com":
			sm := &serviceMonitor{}
			err, d.obj = yaml.UnmarshalStrict(doc, sm), sm
		default:
			var obj runtime.Object
			obj, _, err = decoder.Decode(doc, nil, nil)
			if err == nil {
				o, ok := obj.(interface{ GetName() string })
				if !ok {
					t.Fatalf("%s, document %d: %T has no name", file, i, obj)
				}
				d.obj, d.builtin = o, true
			}
		}
		if err != nil {
			t.Errorf("%s, document %d (%s %s): %v", file, i, tm.APIVersion, tm.Kind, err)
			continue
		}
		if d.obj.GetName() == "" && tm.Kind != "Kustomization" {
			t.Errorf("%s, document %d (%s): want metadata.name", file, i, tm.Kind)
		}
		docs = append(docs, d)
	}
	return docs
}

// serviceMonitor is the part of a Prometheus operator ServiceMonitor
// (monitoring.coreos.com/v1) that the manifests use; decoding it strictly
// refuses any other field. The operator's Go types are not in this
// module's graph, and are not worth their dependencies for a test.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			// TLSConfig is passed through from the chart's values.
			TLSConfig map[string]any `json:"tlsConfig,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// GetName is the ServiceMonitor's name.
func (s *serviceMonitor) GetName() string { return s.Metadata.Name }

// TestKubernetesProbesWithTLS: a node serving TLS and requiring client
// certificates (docs/security.md's advice) answers the probes of the
// manifests, asked as the kubelet asks them: without a client
// certificate, HTTPS without verifying the server, gRPC in plain text
// (the kubelet's gRPC probe cannot speak TLS).
func TestKubernetesProbesWithTLS(t *testing.T) {
	t.Parallel()
	docs := loadManifestDir(t, k8sDir)
	c := container(t, &one[*appsv1.StatefulSet](t, docs, "").Spec.Template.Spec, "sluice")
	checkProbesWithTLS(t, c)
}

// checkProbesWithTLS starts a node with c's listeners on 127.0.0.1 and
// TLS with client certificates required, and asks it c's probes.
func checkProbesWithTLS(t *testing.T, c *corev1.Container) {
	t.Helper()
	fs := serveFlags(t, c)
	cert, key := apitest.Cert(t, t.TempDir(), "node")
	args := []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", cert, "--durability", "memory"}
	if f := fs.Lookup("health-addr"); f != nil && f.Value.String() != "" {
		args = append(args, "--health-addr", "127.0.0.1:0")
	}
	n := startNode(t, nil, args...)
	// The manifests' ports, by the flag that sets them, to this node's
	// listeners.
	bound := map[int32]string{}
	for flag, got := range map[string]string{"grpc-addr": n.grpcAddr, "http-addr": n.httpAddr, "health-addr": n.healthAddr} {
		if f := fs.Lookup(flag); f != nil && f.Value.String() != "" {
			_, p, _ := net.SplitHostPort(f.Value.String())
			port, _ := strconv.Atoi(p)
			bound[int32(port)] = got
		}
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		if p.probe == nil {
			continue
		}
		if err := kubeletProbe(p.probe, c.Ports, bound); err != nil {
			t.Errorf("%s (%s) of a node with --tls-cert and --tls-client-ca: %v", p.name, probeText(p.probe), err)
		}
	}
}

// probeText describes what a probe asks.
func probeText(probe *corev1.Probe) string {
	switch h := probe.ProbeHandler; {
	case h.HTTPGet != nil:
		return fmt.Sprintf("httpGet %s port %s %s", cmp.Or(h.HTTPGet.Scheme, corev1.URISchemeHTTP), h.HTTPGet.Port.String(), h.HTTPGet.Path)
	case h.GRPC != nil:
		return fmt.Sprintf("grpc port %d service %q", h.GRPC.Port, ptrOr(h.GRPC.Service, ""))
	case h.TCPSocket != nil:
		return "tcpSocket port " + h.TCPSocket.Port.String()
	case h.Exec != nil:
		return fmt.Sprintf("exec %q", h.Exec.Command)
	}
	return "no handler"
}

// kubeletProbe asks probe as the kubelet would, of the listeners bound
// (container port → address), and says why it failed.
func kubeletProbe(probe *corev1.Probe, ports []corev1.ContainerPort, bound map[int32]string) error {
	addrOf := func(port intstr.IntOrString) (string, error) {
		cp, ok := resolvePort(port, corev1.ProtocolTCP, ports)
		if !ok {
			return "", fmt.Errorf("port %s is no container port", port.String())
		}
		addr, ok := bound[cp.ContainerPort]
		if !ok {
			return "", fmt.Errorf("port %d is no listener of the node", cp.ContainerPort)
		}
		return addr, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch h := probe.ProbeHandler; {
	case h.HTTPGet != nil:
		addr, err := addrOf(h.HTTPGet.Port)
		if err != nil {
			return err
		}
		scheme := strings.ToLower(string(cmp.Or(h.HTTPGet.Scheme, corev1.URISchemeHTTP)))
		// The kubelet neither verifies a server's certificate nor
		// presents one of its own, and keeps no connection open.
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+h.HTTPGet.Path, nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP %s", resp.Status)
		}
		return nil
	case h.GRPC != nil:
		addr, err := addrOf(intstr.FromInt32(h.GRPC.Port))
		if err != nil {
			return err
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ptrOr(h.GRPC.Service, "")})
		if err != nil {
			return err
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("grpc health %v", resp.Status)
		}
		return nil
	case h.TCPSocket != nil:
		addr, err := addrOf(h.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	return errors.New("not an httpGet, grpc or tcpSocket probe")
}
