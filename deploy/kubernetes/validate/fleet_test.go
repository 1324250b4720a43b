package validate

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/allot-dev/allot"
)

// home returns the overlay that runs the control plane (etcd and the
// coordinators); there must be exactly one.
func home(t *testing.T) *overlay {
	t.Helper()
	var homes []*overlay
	for _, ov := range overlays(t) {
		if ov.find("StatefulSet", "allot-etcd") != nil || ov.find("StatefulSet", "allot-coordinator") != nil {
			homes = append(homes, ov)
		}
	}
	if len(homes) != 1 {
		t.Fatalf("%d overlays run the control plane, want 1", len(homes))
	}
	h := homes[0]
	if h.find("StatefulSet", "allot-etcd") == nil || h.find("StatefulSet", "allot-coordinator") == nil {
		t.Fatalf("%s runs half of the control plane", h.Name)
	}
	return h
}

func argFlags(args []string) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(strings.TrimLeft(a, "-"), "="); ok {
			m[k] = v
		}
	}
	return m
}

func replicas(sts *appsv1.StatefulSet) int32 {
	if sts.Spec.Replicas == nil {
		return 1
	}
	return *sts.Spec.Replicas
}

func TestEtcdCluster(t *testing.T) {
	ov := home(t)
	sts := ov.find("StatefulSet", "allot-etcd").Typed.(*appsv1.StatefulSet)
	n := replicas(sts)
	if n < 3 || n%2 == 0 {
		t.Errorf("etcd: %d members, want an odd number ≥ 3", n)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Error("etcd: podManagementPolicy must be Parallel: a member is ready only with a quorum")
	}
	peerSvc := ov.find("Service", sts.Spec.ServiceName)
	if peerSvc == nil || !peerSvc.Typed.(*corev1.Service).Spec.PublishNotReadyAddresses {
		t.Errorf("etcd: Service %s must publish not-ready addresses (members resolve each other before the quorum)", sts.Spec.ServiceName)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	f := argFlags(c.Args)
	peer, _ := containerPort(c, intstr.FromString("peer"))
	client, _ := containerPort(c, intstr.FromString("client"))
	url := func(pod string, p int32) string {
		return fmt.Sprintf("https://%s.%s.$(POD_NAMESPACE).svc:%d", pod, sts.Spec.ServiceName, p)
	}
	var members []string
	for i := range n {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		members = append(members, pod+"="+url(pod, peer.ContainerPort))
	}
	for flag, want := range map[string]string{
		"name":                        "$(POD_NAME)",
		"initial-cluster":             strings.Join(members, ","),
		"initial-advertise-peer-urls": url("$(POD_NAME)", peer.ContainerPort),
		"advertise-client-urls":       url("$(POD_NAME)", client.ContainerPort),
		"listen-peer-urls":            fmt.Sprintf("https://0.0.0.0:%d", peer.ContainerPort),
		"listen-client-urls":          fmt.Sprintf("https://0.0.0.0:%d", client.ContainerPort),
		"initial-cluster-state":       "new",
	} {
		if f[flag] != want {
			t.Errorf("etcd: --%s=%q, want %q", flag, f[flag], want)
		}
	}
	dataOnVolume := false
	for _, m := range c.VolumeMounts {
		for _, pvc := range sts.Spec.VolumeClaimTemplates {
			dataOnVolume = dataOnVolume || m.Name == pvc.Name && strings.HasPrefix(f["data-dir"], m.MountPath+"/")
		}
	}
	if !dataOnVolume {
		t.Errorf("etcd: --data-dir=%s is not below a persistent volume", f["data-dir"])
	}
	if o := ov.find("PodDisruptionBudget", "allot-etcd"); o == nil {
		t.Error("etcd: no PodDisruptionBudget")
	} else if pdb := o.Typed.(*policyv1.PodDisruptionBudget); pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != int(n/2+1) {
		t.Errorf("etcd: PodDisruptionBudget minAvailable must be the quorum, %d", n/2+1)
	}
}

func TestRedisCluster(t *testing.T) {
	for _, ov := range overlays(t) {
		o := ov.find("StatefulSet", "allot-redis")
		if o == nil {
			t.Errorf("%s: no allot-redis StatefulSet", ov.Name)
			continue
		}
		sts := o.Typed.(*appsv1.StatefulSet)
		n := replicas(sts)
		const perPrimary = 1 // --cluster-replicas
		if n%(perPrimary+1) != 0 || n/(perPrimary+1) < 3 {
			t.Errorf("%s: Redis Cluster of %d nodes: want 3 or more primaries with %d replica each", ov.Name, n, perPrimary)
		}
		rc := sts.Spec.Template.Spec.Containers[0]
		redisPort, _ := containerPort(rc, intstr.FromString("redis"))
		cm, _ := configMap(ov, sts.Spec.Template.Spec.Volumes[0].ConfigMap.Name)
		if cm == nil || !strings.Contains(cm.Data["redis.conf"], "cluster-enabled yes") || !strings.Contains(cm.Data["redis.conf"], "cluster-config-file /data/") {
			t.Errorf("%s: redis.conf must enable cluster mode with its nodes.conf on the volume (/data)", ov.Name)
		}
		// The create Job names every node, and asks for the replicas.
		job := ov.find("Job", "allot-redis-cluster-create")
		if job == nil {
			t.Errorf("%s: no allot-redis-cluster-create Job", ov.Name)
			continue
		}
		script := strings.Join(job.Typed.(*batchv1.Job).Spec.Template.Spec.Containers[0].Args, "\n")
		var idx []string
		for i := range n {
			idx = append(idx, strconv.Itoa(int(i)))
		}
		if !strings.Contains(script, "for i in "+strings.Join(idx, " ")+"; do") ||
			!strings.Contains(script, fmt.Sprintf("%s-$i.%s", sts.Name, sts.Spec.ServiceName)) ||
			!strings.Contains(script, fmt.Sprintf("--cluster-replicas %d", perPrimary)) {
			t.Errorf("%s: the create Job does not loop over the %d nodes %s-N.%s or does not ask for %d replica(s) per primary",
				ov.Name, n, sts.Name, sts.Spec.ServiceName, perPrimary)
		}
		// The enforcers' seeds are nodes of this cluster.
		for _, a := range allotContainers(t, ov) {
			if a.command != "regional" {
				continue
			}
			for _, seed := range strings.Split(a.flags["redis"], ",") {
				host, p, _ := strings.Cut(seed, ":")
				pod, svc, _ := strings.Cut(host, ".")
				if svc != sts.Spec.ServiceName || !isPodOf(pod, sts) || p != strconv.Itoa(int(redisPort.ContainerPort)) {
					t.Errorf("%s: --redis seed %q is not a node of StatefulSet %s (NAME-N.%s:%d)", ov.Name, seed, sts.Name, sts.Spec.ServiceName, redisPort.ContainerPort)
				}
			}
		}
	}
}

// fleetEnv returns the environment of an overlay's regional enforcer,
// with the values of its allot-fleet ConfigMap.
func fleetEnv(t *testing.T, ov *overlay) map[string]string {
	t.Helper()
	for _, a := range allotContainers(t, ov) {
		if a.command == "regional" {
			return a.env
		}
	}
	t.Fatalf("%s: no regional enforcer", ov.Name)
	return nil
}

// resolved is where an address of the fleet leads.
type resolved struct {
	ov  *overlay
	svc *corev1.Service
	// port is the Service port addressed.
	port corev1.ServicePort
}

// resolve follows host:port from overlay from: a short name (the same
// namespace), NAME.NAMESPACE[.svc[.cluster.local]] (the same cluster: the
// same overlay), or NAME.NAMESPACE.svc.clusterset.local (any overlay; the
// Service must be exported).
func resolve(t *testing.T, from *overlay, addr string) (resolved, error) {
	host, p, ok := strings.Cut(addr, ":")
	if !ok {
		return resolved{}, fmt.Errorf("%q: no port", addr)
	}
	parts := strings.Split(host, ".")
	name, ns := parts[0], "allot-"+from.Name
	if len(parts) > 1 {
		ns = parts[1]
	}
	rest := strings.Join(parts[min(2, len(parts)):], ".")
	target := from
	switch rest {
	case "", "svc", "svc.cluster.local":
		if ns != "allot-"+from.Name {
			return resolved{}, fmt.Errorf("%q: namespace %s is not this overlay's: use the clusterset.local name of another region", addr, ns)
		}
	case "svc.clusterset.local":
		target = nil
		for _, ov := range overlays(t) {
			if "allot-"+ov.Name == ns {
				target = ov
			}
		}
		if target == nil {
			return resolved{}, fmt.Errorf("%q: no overlay has namespace %s", addr, ns)
		}
		if target.find("ServiceExport", name) == nil {
			return resolved{}, fmt.Errorf("%q: %s does not export Service %s", addr, target.Name, name)
		}
	default:
		return resolved{}, fmt.Errorf("%q: not a Service name", addr)
	}
	so := target.find("Service", name)
	if so == nil {
		return resolved{}, fmt.Errorf("%q: no Service %s in %s", addr, name, target.Name)
	}
	svc := so.Typed.(*corev1.Service)
	for _, sp := range svc.Spec.Ports {
		if strconv.Itoa(int(sp.Port)) == p {
			return resolved{target, svc, sp}, nil
		}
	}
	return resolved{}, fmt.Errorf("%q: Service %s in %s has no port %s", addr, name, target.Name, p)
}

// TestFleetAddresses follows the addresses that each region's allot-fleet
// ConfigMap gives its enforcers, across overlays: the peers are the other
// regions' enforcers, the coordinators are every coordinator of the home
// region, one Service per pod, and etcd is the home region's etcd.
func TestFleetAddresses(t *testing.T) {
	h := home(t)
	coord := h.find("StatefulSet", "allot-coordinator").Typed.(*appsv1.StatefulSet)
	var names []string
	for _, ov := range overlays(t) {
		names = append(names, ov.Name)
	}
	for _, ov := range overlays(t) {
		env := fleetEnv(t, ov)
		if env["ALLOT_REGION"] != ov.Name {
			t.Errorf("%s: ALLOT_REGION=%q, want the overlay's name", ov.Name, env["ALLOT_REGION"])
		}
		// --peers: NAME=ADDR for every other region.
		var peers []string
		for _, p := range strings.Split(env["ALLOT_PEERS"], ",") {
			name, addr, _ := strings.Cut(p, "=")
			peers = append(peers, name)
			r, err := resolve(t, ov, addr)
			switch {
			case err != nil:
				t.Errorf("%s: peer %s: %v", ov.Name, name, err)
			case r.ov.Name != name || len(selected(r.ov, r.svc.Spec.Selector)) != 1 || selected(r.ov, r.svc.Spec.Selector)[0].obj.Name != "allot-regional" || r.port.Name != "grpc":
				t.Errorf("%s: peer %s at %s is not the gRPC port of region %s's enforcers", ov.Name, name, addr, name)
			}
		}
		sort.Strings(peers)
		others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == ov.Name })
		sort.Strings(others)
		if !slices.Equal(peers, others) {
			t.Errorf("%s: --peers names %v, want the other regions %v", ov.Name, peers, others)
		}
		// --coordinator: each coordinator pod once.
		pods := map[string]bool{}
		for _, addr := range strings.Split(env["ALLOT_COORDINATORS"], ",") {
			r, err := resolve(t, ov, addr)
			if err != nil {
				t.Errorf("%s: coordinator: %v", ov.Name, err)
				continue
			}
			pod := r.svc.Spec.Selector[podNameLabel]
			if r.ov != h || !isPodOf(pod, coord) || r.port.Name != "grpc" {
				t.Errorf("%s: coordinator address %s is not one coordinator pod's gRPC port (a Service selecting %s=%s-N)", ov.Name, addr, podNameLabel, coord.Name)
			}
			pods[pod] = true
		}
		if len(pods) != int(replicas(coord)) {
			t.Errorf("%s: --coordinator reaches %d of the %d coordinators: a region must be able to try each until it finds the leader", ov.Name, len(pods), replicas(coord))
		}
		// --etcd: the home region's etcd client port.
		for _, addr := range strings.Split(env["ALLOT_ETCD"], ",") {
			r, err := resolve(t, ov, addr)
			if err != nil {
				t.Errorf("%s: etcd: %v", ov.Name, err)
				continue
			}
			ws := selected(r.ov, r.svc.Spec.Selector)
			if r.ov != h || len(ws) != 1 || ws[0].obj.Name != "allot-etcd" || r.port.Name != "client" {
				t.Errorf("%s: etcd address %s is not the client port of %s's etcd", ov.Name, addr, h.Name)
			}
		}
	}
	// The coordinators' own --etcd.
	for _, a := range allotContainers(t, h) {
		if a.command != "coordinator" {
			continue
		}
		r, err := resolve(t, h, a.flags["etcd"])
		if err != nil || r.port.Name != "client" || selected(h, r.svc.Spec.Selector)[0].obj.Name != "allot-etcd" {
			t.Errorf("coordinator --etcd=%s is not etcd's client port (%v)", a.flags["etcd"], err)
		}
	}
	// One Service per coordinator pod, each exported.
	for i := range replicas(coord) {
		name := fmt.Sprintf("%s-%d", coord.Name, i)
		if h.find("Service", name) == nil || h.find("ServiceExport", name) == nil {
			t.Errorf("%s: coordinator %s needs a Service of its own, exported", h.Name, name)
		}
	}
}

// TestLimitsFitTheRegions parses the fleet's limits (the allot-limits
// ConfigMap) with allot's own parser: every region a domain names must be
// an overlay (else its share is stranded), and every overlay's region is
// in some domain.
func TestLimitsFitTheRegions(t *testing.T) {
	h := home(t)
	var cm *corev1.ConfigMap
	for _, o := range h.ofKind("ConfigMap") {
		if strings.HasPrefix(o.Name, "allot-limits") {
			cm = o.Typed.(*corev1.ConfigMap)
		}
	}
	if cm == nil {
		t.Fatal("no allot-limits ConfigMap in the home overlay")
	}
	cfg, err := allot.ParseConfig("allot-limits/limits.yaml", []byte(cm.Data["limits.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	inSome := map[string]bool{}
	for _, d := range cfg.Domains {
		for _, r := range d.Regions {
			inSome[r] = true
			found := false
			for _, ov := range overlays(t) {
				found = found || ov.Name == r
			}
			if !found {
				t.Errorf("domain %s names region %s, which has no overlay", d.Name, r)
			}
		}
	}
	for _, ov := range overlays(t) {
		if !inSome[ov.Name] {
			t.Errorf("region %s is in no domain of the limits", ov.Name)
		}
	}
}
