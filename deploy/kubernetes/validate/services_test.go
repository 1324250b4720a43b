package validate

import (
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// podNameLabel is set by the StatefulSet controller on each pod, not in
// the template: a Service that selects it selects one pod of the set.
const podNameLabel = "statefulset.kubernetes.io/pod-name"

// selected returns the workloads whose pod template set matches sel. A
// podNameLabel requirement is checked against the StatefulSet's pod names.
func selected(ov *overlay, sel map[string]string) []workload {
	set := labels.Set{}
	pod, byName := "", false
	for k, v := range sel {
		if k == podNameLabel {
			pod, byName = v, true
			continue
		}
		set[k] = v
	}
	var out []workload
	for _, w := range workloads(ov) {
		if len(set) == 0 || !labels.SelectorFromSet(set).Matches(labels.Set(w.template.Labels)) {
			continue
		}
		if byName {
			sts, ok := w.obj.Typed.(*appsv1.StatefulSet)
			if !ok || !isPodOf(pod, sts) {
				continue
			}
		}
		out = append(out, w)
	}
	return out
}

// isPodOf reports whether pod is one of the StatefulSet's pods.
func isPodOf(pod string, sts *appsv1.StatefulSet) bool {
	n := int32(1)
	if sts.Spec.Replicas != nil {
		n = *sts.Spec.Replicas
	}
	for i := range n {
		if pod == sts.Name+"-"+itoa(i) {
			return true
		}
	}
	return false
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

func labelSelected(ov *overlay, sel *metav1.LabelSelector) []workload {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil
	}
	var out []workload
	for _, w := range workloads(ov) {
		if s.Matches(labels.Set(w.template.Labels)) {
			out = append(out, w)
		}
	}
	return out
}

func TestServices(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, o := range ov.ofKind("Service") {
			svc := o.Typed.(*corev1.Service)
			ws := selected(ov, svc.Spec.Selector)
			if len(ws) == 0 {
				t.Errorf("%s: Service %s selects no workload of the overlay", ov.Name, svc.Name)
				continue
			}
			for _, p := range svc.Spec.Ports {
				for _, w := range ws {
					found := false
					for _, c := range w.template.Spec.Containers {
						if cp, ok := containerPort(c, p.TargetPort); ok && cp.Protocol == p.Protocol {
							found = true
						}
					}
					if !found {
						t.Errorf("%s: Service %s port %s: target %s is not a port of %s", ov.Name, svc.Name, p.Name, p.TargetPort.String(), w)
					}
				}
			}
		}
		for _, o := range ov.ofKind("StatefulSet") {
			sts := o.Typed.(*appsv1.StatefulSet)
			so := ov.find("Service", sts.Spec.ServiceName)
			if so == nil {
				t.Errorf("%s: StatefulSet %s: no Service %q", ov.Name, sts.Name, sts.Spec.ServiceName)
				continue
			}
			if svc := so.Typed.(*corev1.Service); svc.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("%s: StatefulSet %s: Service %s is not headless", ov.Name, sts.Name, svc.Name)
			}
		}
	}
}

func TestAutoscaling(t *testing.T) {
	for _, ov := range overlays(t) {
		hpas := ov.ofKind("HorizontalPodAutoscaler")
		if len(hpas) == 0 {
			t.Errorf("%s: no HorizontalPodAutoscaler", ov.Name)
		}
		for _, o := range hpas {
			h := o.Typed.(*autoscalingv2.HorizontalPodAutoscaler)
			ref := h.Spec.ScaleTargetRef
			to := ov.find(ref.Kind, ref.Name)
			if to == nil || ref.APIVersion != "apps/v1" {
				t.Errorf("%s: HPA %s: target %s %s/%s is not in the overlay", ov.Name, h.Name, ref.APIVersion, ref.Kind, ref.Name)
				continue
			}
			d, ok := to.Typed.(*appsv1.Deployment)
			if !ok {
				t.Errorf("%s: HPA %s scales a %s", ov.Name, h.Name, ref.Kind)
				continue
			}
			if d.Spec.Replicas != nil {
				t.Errorf("%s: Deployment %s sets replicas, which kubectl apply would reset under its HPA", ov.Name, d.Name)
			}
			if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
				t.Errorf("%s: HPA %s: want 2 ≤ minReplicas ≤ maxReplicas", ov.Name, h.Name)
			}
			cpu := false
			for _, m := range h.Spec.Metrics {
				if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource != nil && m.Resource.Name == corev1.ResourceCPU &&
					m.Resource.Target.Type == autoscalingv2.UtilizationMetricType && m.Resource.Target.AverageUtilization != nil {
					cpu = true
				}
			}
			if !cpu {
				t.Errorf("%s: HPA %s does not scale on CPU utilisation", ov.Name, h.Name)
			}
		}
	}
}

func TestDisruptionBudgets(t *testing.T) {
	for _, ov := range overlays(t) {
		covered := map[*object]bool{}
		for _, o := range ov.ofKind("PodDisruptionBudget") {
			pdb := o.Typed.(*policyv1.PodDisruptionBudget)
			ws := labelSelected(ov, pdb.Spec.Selector)
			if len(ws) != 1 {
				t.Errorf("%s: PDB %s selects %d workloads, want 1", ov.Name, pdb.Name, len(ws))
				continue
			}
			w := ws[0]
			covered[w.obj] = true
			if pdb.Spec.MinAvailable != nil && w.replicas != nil && pdb.Spec.MinAvailable.IntValue() >= int(*w.replicas) {
				t.Errorf("%s: PDB %s: minAvailable %s of %d replicas blocks every drain", ov.Name, pdb.Name, pdb.Spec.MinAvailable.String(), *w.replicas)
			}
		}
		for _, o := range append(ov.ofKind("Deployment"), ov.ofKind("StatefulSet")...) {
			if !covered[o] {
				t.Errorf("%s: %s has no PodDisruptionBudget", ov.Name, o)
			}
		}
	}
	for _, ov := range overlays(t) {
		if o := ov.find("PodDisruptionBudget", "allot-coordinator"); o != nil {
			pdb := o.Typed.(*policyv1.PodDisruptionBudget)
			if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
				t.Errorf("%s: PDB allot-coordinator: want minAvailable 1", ov.Name)
			}
		}
	}
}

// TestAntiAffinity: the replicas of etcd and of the coordinator must not
// share a node (one node lost must not take a quorum or both coordinators).
func TestAntiAffinity(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, name := range []string{"allot-etcd", "allot-coordinator"} {
			o := ov.find("StatefulSet", name)
			if o == nil {
				continue
			}
			sts := o.Typed.(*appsv1.StatefulSet)
			a := sts.Spec.Template.Spec.Affinity
			ok := false
			if a != nil && a.PodAntiAffinity != nil {
				for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
					s, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
					if err == nil && term.TopologyKey == "kubernetes.io/hostname" && s.Matches(labels.Set(sts.Spec.Template.Labels)) {
						ok = true
					}
				}
			}
			if !ok {
				t.Errorf("%s: %s: no required anti-affinity on kubernetes.io/hostname against its own pods", ov.Name, name)
			}
		}
	}
}

func TestServiceMonitors(t *testing.T) {
	for _, ov := range overlays(t) {
		scraped := map[*object]int{}
		for _, o := range ov.ofKind("ServiceMonitor") {
			sm := o.Typed.(*monitoringv1.ServiceMonitor)
			sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			if err != nil || sel.Empty() {
				t.Errorf("%s: ServiceMonitor %s: bad or empty selector", ov.Name, sm.Name)
				continue
			}
			var svcs []*corev1.Service
			for _, so := range ov.ofKind("Service") {
				if sel.Matches(labels.Set(so.Typed.(*corev1.Service).Labels)) {
					svcs = append(svcs, so.Typed.(*corev1.Service))
				}
			}
			if len(svcs) != 1 {
				t.Errorf("%s: ServiceMonitor %s selects %d Services, want 1", ov.Name, sm.Name, len(svcs))
				continue
			}
			svc := svcs[0]
			for _, ep := range sm.Spec.Endpoints {
				found := false
				for _, p := range svc.Spec.Ports {
					found = found || p.Name == ep.Port
				}
				if !found || ep.Path != "/metrics" {
					t.Errorf("%s: ServiceMonitor %s: endpoint port %q path %q: want a port of Service %s and /metrics", ov.Name, sm.Name, ep.Port, ep.Path, svc.Name)
				}
			}
			for _, w := range selected(ov, svc.Spec.Selector) {
				scraped[w.obj]++
			}
		}
		for _, w := range workloads(ov) {
			if w.obj.GVK.Kind == "Job" || w.obj.Name == "allot-redis" {
				continue // no /metrics (Redis would need an exporter)
			}
			if scraped[w.obj] != 1 {
				t.Errorf("%s: %s is scraped by %d ServiceMonitors, want 1", ov.Name, w, scraped[w.obj])
			}
		}
	}
}

func TestNetworkPolicies(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, o := range ov.ofKind("NetworkPolicy") {
			np := o.Typed.(*networkingv1.NetworkPolicy)
			targets := labelSelected(ov, &np.Spec.PodSelector)
			if len(targets) == 0 {
				t.Errorf("%s: NetworkPolicy %s selects no pods", ov.Name, np.Name)
			}
			for _, rule := range np.Spec.Ingress {
				for _, peer := range rule.From {
					if peer.PodSelector != nil && len(labelSelected(ov, peer.PodSelector)) == 0 {
						t.Errorf("%s: NetworkPolicy %s admits pods %v, none of which exist", ov.Name, np.Name, peer.PodSelector.MatchLabels)
					}
				}
				for _, p := range rule.Ports {
					for _, w := range targets {
						found := false
						for _, c := range w.template.Spec.Containers {
							_, ok := containerPort(c, *p.Port)
							found = found || ok
						}
						if !found {
							t.Errorf("%s: NetworkPolicy %s: port %s is not a port of %s", ov.Name, np.Name, p.Port.String(), w)
						}
					}
				}
			}
		}
		// Every pod that connects to Redis is admitted.
		if o := ov.find("NetworkPolicy", "allot-redis"); o != nil {
			np := o.Typed.(*networkingv1.NetworkPolicy)
			for _, w := range workloads(ov) {
				talks := false
				for _, c := range w.template.Spec.Containers {
					talks = talks || strings.Contains(strings.Join(append(c.Command, c.Args...), " "), "allot-redis")
				}
				if !talks {
					continue
				}
				admitted := false
				for _, rule := range np.Spec.Ingress {
					for _, peer := range rule.From {
						if peer.PodSelector != nil {
							s, _ := metav1.LabelSelectorAsSelector(peer.PodSelector)
							admitted = admitted || s.Matches(labels.Set(w.template.Labels))
						}
					}
				}
				if !admitted {
					t.Errorf("%s: %s talks to Redis but NetworkPolicy allot-redis does not admit it", ov.Name, w)
				}
			}
		}
	}
}
