package validate

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// workload is a Deployment, StatefulSet or Job and its pod template.
type workload struct {
	obj      *object
	template *corev1.PodTemplateSpec
	replicas *int32 // nil for a Job, or when the field is unset
}

func (w workload) String() string { return w.obj.String() }

func workloads(ov *overlay) []workload {
	var out []workload
	for _, o := range ov.Objects {
		switch v := o.Typed.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o, &v.Spec.Template, v.Spec.Replicas})
		case *appsv1.StatefulSet:
			out = append(out, workload{o, &v.Spec.Template, v.Spec.Replicas})
		case *batchv1.Job:
			out = append(out, workload{o, &v.Spec.Template, nil})
		case *appsv1.DaemonSet, *appsv1.ReplicaSet, *batchv1.CronJob, *corev1.Pod:
			panic(fmt.Sprintf("%s: a workload kind the tests do not check yet", o))
		}
	}
	return out
}

// allotImage reports whether image is allot's (built from the Dockerfile).
func allotImage(image string) bool {
	repo := image
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return path.Base(repo) == "allot"
}

// isShell reports whether the container runs a shell script, whose
// $(...) are command substitutions rather than the kubelet's references.
func isShell(c corev1.Container) bool {
	return len(c.Command) > 0 && slices.Contains([]string{"sh", "bash", "/bin/sh", "/bin/bash"}, c.Command[0])
}

func TestPodSecurity(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, w := range workloads(ov) {
			spec := w.template.Spec
			psc := spec.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
				t.Errorf("%s: %s: pod securityContext.runAsNonRoot is not true", ov.Name, w)
			}
			if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
				t.Errorf("%s: %s: pod securityContext.runAsUser is unset or 0", ov.Name, w)
			}
			if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: %s: no RuntimeDefault seccomp profile", ov.Name, w)
			}
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("%s: %s: mounts a service account token it does not use", ov.Name, w)
			}
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				sc := c.SecurityContext
				if sc == nil {
					t.Errorf("%s: %s: container %s has no securityContext", ov.Name, w, c.Name)
					continue
				}
				if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
					t.Errorf("%s: %s: container %s runs as root", ov.Name, w, c.Name)
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: %s: container %s: allowPrivilegeEscalation is not false", ov.Name, w, c.Name)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: %s: container %s: readOnlyRootFilesystem is not true", ov.Name, w, c.Name)
				}
				if sc.Privileged != nil && *sc.Privileged {
					t.Errorf("%s: %s: container %s is privileged", ov.Name, w, c.Name)
				}
				if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
					t.Errorf("%s: %s: container %s does not drop all capabilities", ov.Name, w, c.Name)
				}
			}
		}
	}
}

func TestResources(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, w := range workloads(ov) {
			for _, c := range append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...) {
				req, lim := c.Resources.Requests, c.Resources.Limits
				for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
					if q, ok := req[r]; !ok || q.Sign() <= 0 {
						t.Errorf("%s: %s: container %s requests no %s", ov.Name, w, c.Name, r)
					}
				}
				if q, ok := lim[corev1.ResourceMemory]; !ok || q.Sign() <= 0 {
					t.Errorf("%s: %s: container %s has no memory limit", ov.Name, w, c.Name)
				}
				for r, l := range lim {
					if q, ok := req[r]; ok && l.Cmp(q) < 0 {
						t.Errorf("%s: %s: container %s: %s limit %s below its request %s", ov.Name, w, c.Name, r, l.String(), q.String())
					}
				}
			}
		}
	}
}

func TestImages(t *testing.T) {
	for _, ov := range overlays(t) {
		allot := map[string]bool{}
		for _, w := range workloads(ov) {
			for _, c := range append(slices.Clone(w.template.Spec.InitContainers), w.template.Spec.Containers...) {
				img := c.Image
				name, tag, hasTag := strings.Cut(path.Base(img), ":")
				switch {
				case strings.Contains(img, "@sha256:"):
				case !hasTag || tag == "" || tag == "latest":
					t.Errorf("%s: %s: container %s: image %q has no pinned tag", ov.Name, w, c.Name, img)
				case name == "allot" && !strings.Contains(img, "/"):
					t.Errorf("%s: %s: container %s: image %q was not replaced by kustomize's images", ov.Name, w, c.Name, img)
				}
				if allotImage(img) {
					allot[img] = true
				}
			}
		}
		if len(allot) != 1 {
			t.Errorf("%s: allot's containers run %d different images, want 1: %v", ov.Name, len(allot), allot)
		}
	}
}

// containerPort resolves a probe's or a Service's port (a name or a
// number) among the container's ports.
func containerPort(c corev1.Container, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, cp := range c.Ports {
		if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

func TestProbes(t *testing.T) {
	coordinatorReadyz := strings.Contains(string(readRepoFile(t, "cmd/allot/coordinator.go")), `"GET /readyz"`)
	for _, ov := range overlays(t) {
		for _, w := range workloads(ov) {
			if _, ok := w.obj.Typed.(*batchv1.Job); ok {
				continue
			}
			for _, c := range w.template.Spec.Containers {
				for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
					if p == nil {
						if kind != "startup" {
							t.Errorf("%s: %s: container %s has no %s probe", ov.Name, w, c.Name, kind)
						}
						continue
					}
					if g := p.HTTPGet; g != nil {
						if _, ok := containerPort(c, g.Port); !ok {
							t.Errorf("%s: %s: container %s: %s probe port %s is not a container port", ov.Name, w, c.Name, kind, g.Port.String())
						}
					}
				}
				if !allotImage(c.Image) || len(c.Args) == 0 {
					continue
				}
				// allot's own endpoints (regional/server/http.go, cmd/allot/coordinator.go).
				wantReady := "/readyz"
				if c.Args[0] == "coordinator" && !coordinatorReadyz {
					wantReady = "/healthz"
				}
				if c.Args[0] == "coordinator" && coordinatorReadyz && c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
					t.Errorf("%s: %s: allot coordinator serves /readyz now: probe readiness there", ov.Name, w)
				}
				if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != wantReady || p.HTTPGet.Port.String() != "http" {
					t.Errorf("%s: %s: allot %s: readiness must be GET %s on the http port", ov.Name, w, c.Args[0], wantReady)
				}
				if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "http" {
					t.Errorf("%s: %s: allot %s: liveness must be GET /healthz on the http port", ov.Name, w, c.Args[0])
				}
			}
		}
	}
}

// varRef is the kubelet's $(NAME) reference.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// containerEnv is what a container's $(NAME) can refer to: its env, and
// the keys of the ConfigMaps of its envFrom (which must exist).
func containerEnv(t *testing.T, ov *overlay, w workload, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Errorf("%s: %s: container %s: envFrom other than a ConfigMap", ov.Name, w, c.Name)
			continue
		}
		cm, _ := configMap(ov, ef.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("%s: %s: container %s: envFrom ConfigMap %s is not in the overlay", ov.Name, w, c.Name, ef.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			env[ef.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = "<" + e.Name + ">"
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				if cm, _ := configMap(ov, r.Name); cm == nil || cm.Data[r.Key] == "" {
					t.Errorf("%s: %s: container %s: env %s: no key %s in ConfigMap %s", ov.Name, w, c.Name, e.Name, r.Key, r.Name)
				}
			}
		}
		env[e.Name] = v
	}
	return env
}

func configMap(ov *overlay, name string) (*corev1.ConfigMap, *object) {
	o := ov.find("ConfigMap", name)
	if o == nil {
		return nil, nil
	}
	return o.Typed.(*corev1.ConfigMap), o
}

func TestReferences(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, w := range workloads(ov) {
			spec := w.template.Spec
			volumes := map[string]bool{}
			for _, v := range spec.Volumes {
				volumes[v.Name] = true
				if v.ConfigMap != nil {
					cm, _ := configMap(ov, v.ConfigMap.Name)
					if cm == nil {
						t.Errorf("%s: %s: volume %s: ConfigMap %s is not in the overlay", ov.Name, w, v.Name, v.ConfigMap.Name)
					}
				}
				if v.Secret != nil || v.HostPath != nil {
					t.Errorf("%s: %s: volume %s: secrets and host paths are not expected", ov.Name, w, v.Name)
				}
			}
			if sts, ok := w.obj.Typed.(*appsv1.StatefulSet); ok {
				for _, pvc := range sts.Spec.VolumeClaimTemplates {
					volumes[pvc.Name] = true
				}
			}
			for _, c := range spec.Containers {
				for _, m := range c.VolumeMounts {
					if !volumes[m.Name] {
						t.Errorf("%s: %s: container %s mounts unknown volume %s", ov.Name, w, c.Name, m.Name)
					}
				}
				env := containerEnv(t, ov, w, c)
				if isShell(c) {
					continue
				}
				for _, a := range append(slices.Clone(c.Command), c.Args...) {
					for _, m := range varRef.FindAllStringSubmatch(a, -1) {
						if _, ok := env[m[1]]; !ok {
							t.Errorf("%s: %s: container %s: %q refers to $(%s), which is not in its environment", ov.Name, w, c.Name, a, m[1])
						}
					}
				}
			}
		}
	}
}

// expand replaces $(NAME) as the kubelet does; unknown names stay.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// allotContainer is one container running allot or allotctl.
type allotContainer struct {
	ov      *overlay
	w       workload
	c       corev1.Container
	command string            // regional, coordinator or "allotctl apply"
	flags   map[string]string // as written (not expanded)
	pos     []string
	env     map[string]string
}

func allotContainers(t *testing.T, ov *overlay) []allotContainer {
	t.Helper()
	declared := commandFlags(t)
	var out []allotContainer
	for _, w := range workloads(ov) {
		for _, c := range w.template.Spec.Containers {
			if !allotImage(c.Image) {
				continue
			}
			var cmd string
			var args []string
			switch {
			case len(c.Command) == 0 && len(c.Args) > 0 && (c.Args[0] == "regional" || c.Args[0] == "coordinator"):
				cmd, args = c.Args[0], c.Args[1:]
			case len(c.Command) == 1 && c.Command[0] == "/usr/local/bin/allotctl" && len(c.Args) >= 2 && c.Args[0] == "limits" && c.Args[1] == "apply":
				cmd, args = "allotctl apply", c.Args[2:]
			default:
				t.Errorf("%s: %s: container %s runs allot's image with %q %q: the tests know regional, coordinator and allotctl limits apply (the image's entrypoint is /usr/local/bin/allot)",
					ov.Name, w, c.Name, c.Command, c.Args)
				continue
			}
			flags, pos, errs := parseFlags(args, declared[cmd])
			for _, e := range errs {
				t.Errorf("%s: %s: container %s: %s: %s", ov.Name, w, c.Name, cmd, e)
			}
			out = append(out, allotContainer{ov, w, c, cmd, flags, pos, containerEnv(t, ov, w, c)})
		}
	}
	return out
}

// port returns the port of a listen or dial address such as
// $(POD_IP):8081, :8080 or host:port.
func port(addr string) (int32, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return 0, fmt.Errorf("%q has no port", addr)
	}
	p, err := strconv.ParseInt(addr[i+1:], 10, 32)
	return int32(p), err
}

func TestAllotArguments(t *testing.T) {
	for _, ov := range overlays(t) {
		cmds := map[string]int{}
		for _, a := range allotContainers(t, ov) {
			cmds[a.command]++
			where := fmt.Sprintf("%s: %s: %s", ov.Name, a.w, a.command)
			if a.command != "allotctl apply" && len(a.pos) > 0 {
				t.Errorf("%s: positional arguments %q (flags stop at the first one)", where, a.pos)
			}
			// Listen addresses match the named container ports.
			for flag, portName := range map[string]string{"grpc-addr": "grpc", "http-addr": "http"} {
				if a.command == "allotctl apply" {
					break
				}
				v, ok := a.flags[flag]
				if !ok {
					t.Errorf("%s: no --%s (the default listens on 127.0.0.1 only)", where, flag)
					continue
				}
				if strings.HasPrefix(v, "127.") || strings.HasPrefix(v, "localhost:") {
					t.Errorf("%s: --%s=%s listens on loopback only", where, flag, v)
				}
				p, err := port(v)
				cp, found := containerPort(a.c, intstr.FromString(portName))
				if err != nil || !found || cp.ContainerPort != p {
					t.Errorf("%s: --%s=%s does not match container port %q (%d)", where, flag, v, portName, cp.ContainerPort)
				}
			}
			switch a.command {
			case "regional":
				for _, req := range []string{"region", "etcd", "coordinator", "peers", "redis"} {
					if a.flags[req] == "" {
						t.Errorf("%s: --%s is missing", where, req)
					}
				}
				if _, ok := a.flags["config"]; !ok {
					// It follows etcd and registers its gRPC listen address
					// there for the Admin API: it must be a routable one.
					host, _, _ := net.SplitHostPort(a.flags["grpc-addr"])
					if host == "" || host == "0.0.0.0" || host == "::" {
						t.Errorf("%s: --grpc-addr=%s is registered in etcd for allotctl: listen on the pod IP", where, a.flags["grpc-addr"])
					}
				}
				if strings.Contains(a.flags["redis"], ",") && a.flags["redis-cluster"] != "true" {
					t.Errorf("%s: several --redis seeds without --redis-cluster", where)
				}
			case "coordinator":
				if a.flags["etcd"] == "" {
					t.Errorf("%s: --etcd is missing", where)
				}
				if host, _, _ := net.SplitHostPort(a.flags["grpc-addr"]); (host == "" || host == "0.0.0.0" || host == "::") && a.flags["advertise"] == "" {
					t.Errorf("%s: listens on every address without --advertise: its election key would name %s", where, a.flags["grpc-addr"])
				}
			case "allotctl apply":
				if len(a.pos) != 1 {
					t.Fatalf("%s: want one file, got %q", where, a.pos)
				}
				file := a.pos[0]
				mounted := false
				for _, m := range a.c.VolumeMounts {
					if strings.HasPrefix(file, m.MountPath+"/") {
						for _, v := range a.w.template.Spec.Volumes {
							if v.Name == m.Name && v.ConfigMap != nil {
								cm, _ := configMap(ov, v.ConfigMap.Name)
								key := strings.TrimPrefix(file, m.MountPath+"/")
								if cm == nil || cm.Data[key] == "" {
									t.Errorf("%s: %s is not a key of ConfigMap %s", where, file, v.ConfigMap.Name)
								}
								mounted = true
							}
						}
					}
				}
				if !mounted {
					t.Errorf("%s: %s is not in a mounted ConfigMap", where, file)
				}
				if a.flags["addr"] == "" {
					t.Errorf("%s: no --addr (default: 127.0.0.1:8070)", where)
				}
			}
		}
		if cmds["regional"] != 1 {
			t.Errorf("%s: %d regional enforcer containers, want 1", ov.Name, cmds["regional"])
		}
	}
	// allotctl's command exists as the Job calls it.
	if !regexp.MustCompile(`"limits":\s*\{[^}]*"apply":`).Match(readRepoFile(t, "cmd/allotctl/main.go")) {
		t.Error(`cmd/allotctl: no "limits apply" command`)
	}
}

func TestLimitsFileIsTheExample(t *testing.T) {
	copyOf, err := os.ReadFile(filepath.Join(kustomizeRoot, "control-plane", "limits.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(copyOf) != string(readRepoFile(t, "deploy/examples/limits.yaml")) {
		t.Error("deploy/kubernetes/control-plane/limits.yaml differs from deploy/examples/limits.yaml: " +
			"cp deploy/examples/limits.yaml deploy/kubernetes/control-plane/limits.yaml (or drop this test once the fleet's limits are your own)")
	}
}
