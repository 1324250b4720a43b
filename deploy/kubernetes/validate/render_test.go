package validate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const (
	// repoRoot is the repository, seen from this package's folder.
	repoRoot = "../../.."
	// kustomizeRoot is deploy/kubernetes.
	kustomizeRoot = ".."
)

// object is one rendered object: its JSON, and what it decoded into (a
// typed API object, or a map for the CRDs without Go types here).
type object struct {
	GVK       schema.GroupVersionKind
	Name      string
	Namespace string
	JSON      []byte
	Typed     runtime.Object // nil for unstructured kinds
	Raw       map[string]any
}

func (o *object) String() string { return fmt.Sprintf("%s %s/%s", o.GVK.Kind, o.Namespace, o.Name) }

// overlay is one rendered overlay.
type overlay struct {
	Name    string // the folder: the region
	Dir     string
	Objects []*object
}

// find returns the object of kind and name, or nil.
func (ov *overlay) find(kind, name string) *object {
	for _, o := range ov.Objects {
		if o.GVK.Kind == kind && o.Name == name {
			return o
		}
	}
	return nil
}

// ofKind returns the objects of kind, in render order.
func (ov *overlay) ofKind(kind string) []*object {
	var out []*object
	for _, o := range ov.Objects {
		if o.GVK.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// unstructuredKinds are the CRD kinds decoded into maps: their fields are
// checked by hand (TestServiceExports, TestIssuer), since no Go types are
// used for them.
var unstructuredKinds = map[schema.GroupVersionKind]bool{
	{Group: "multicluster.x-k8s.io", Version: "v1alpha1", Kind: "ServiceExport"}: true,
	{Group: "cert-manager.io", Version: "v1", Kind: "Issuer"}:                    true, // checkIssuer, tls_test.go
}

var (
	renderOnce sync.Once
	rendered   []*overlay
	renderErr  error
)

// overlays renders every overlay once per test binary.
func overlays(t *testing.T) []*overlay {
	t.Helper()
	renderOnce.Do(func() { rendered, renderErr = renderOverlays() })
	if renderErr != nil {
		t.Fatal(renderErr)
	}
	return rendered
}

func renderOverlays() ([]*overlay, error) {
	dirs, err := filepath.Glob(filepath.Join(kustomizeRoot, "overlays", "*", "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no overlays in %s/overlays", kustomizeRoot)
	}
	sort.Strings(dirs)
	var out []*overlay
	for _, k := range dirs {
		dir := filepath.Dir(k)
		ov, err := render(dir)
		if err != nil {
			return nil, err
		}
		out = append(out, ov)
	}
	return out, nil
}

// decoder decodes strictly (unknown and duplicate fields are errors) into
// the Kubernetes API types and the Prometheus Operator's.
var decoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// render runs kustomize as kubectl apply -k does (files only from within
// each kustomization's folder, no plugins) and decodes every object.
func render(dir string) (*overlay, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	ov := &overlay{Name: filepath.Base(dir), Dir: dir}
	for _, r := range m.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", dir, r.CurId(), err)
		}
		o, err := decode(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", dir, r.CurId(), err)
		}
		ov.Objects = append(ov.Objects, o)
	}
	return ov, nil
}

func decode(b []byte) (*object, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &tm); err != nil {
		return nil, err
	}
	o := &object{GVK: schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind), Name: tm.Metadata.Name, Namespace: tm.Metadata.Namespace, JSON: b, Raw: raw}
	if o.Name == "" {
		return nil, fmt.Errorf("%s without metadata.name", o.GVK)
	}
	if unstructuredKinds[o.GVK] {
		return o, nil
	}
	typed, gvk, err := decoder.Decode(b, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", o.GVK, err)
	}
	if *gvk != o.GVK {
		return nil, fmt.Errorf("decoded %s as %s", o.GVK, gvk)
	}
	o.Typed = typed
	return o, nil
}

// TestOverlaysRender renders every overlay and decodes every object
// strictly (in overlays, which fails the test at the first error).
func TestOverlaysRender(t *testing.T) {
	for _, ov := range overlays(t) {
		kinds := map[string]int{}
		for _, o := range ov.Objects {
			kinds[o.GVK.Kind]++
		}
		t.Logf("%s: %d objects %v", ov.Name, len(ov.Objects), kinds)
	}
}

// TestStrictDecodingCatchesUnknownFields makes sure the decoder is strict:
// a misspelt field must fail, or the render test proves nothing.
func TestStrictDecodingCatchesUnknownFields(t *testing.T) {
	for _, bad := range []string{
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replica":3}}`,
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"},"spec":{"ports":[{"port":80,"targetport":8080}]}}`,
		`{"apiVersion":"monitoring.coreos.com/v1","kind":"PrometheusRule","metadata":{"name":"x"},"spec":{"groups":[{"name":"g","rules":[{"alert":"A","expr":"up","fro":"1m"}]}]}}`,
		`{"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor","metadata":{"name":"x"},"spec":{"selector":{},"endpoint":[]}}`,
	} {
		if _, err := decode([]byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("decode(%s) = %v, want an unknown field error", bad, err)
		}
	}
	if _, err := decode([]byte(`{"apiVersion":"example.com/v1","kind":"Gadget","metadata":{"name":"x"}}`)); err == nil {
		t.Error("a kind without types decoded")
	}
}

// TestNamespaces: each overlay puts everything in its namespace,
// allot-REGION, and creates it.
func TestNamespaces(t *testing.T) {
	for _, ov := range overlays(t) {
		want := "allot-" + ov.Name
		if ov.find("Namespace", want) == nil {
			t.Errorf("%s: no Namespace %s", ov.Name, want)
		}
		for _, o := range ov.Objects {
			if o.GVK.Kind != "Namespace" && o.Namespace != want {
				t.Errorf("%s: %s is in namespace %q, want %q", ov.Name, o, o.Namespace, want)
			}
		}
	}
}

// TestServiceExports checks the Multi-Cluster Services objects, which have
// no Go types here: only metadata, and a Service of the same name.
func TestServiceExports(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, o := range ov.ofKind("ServiceExport") {
			for k := range o.Raw {
				if !slices.Contains([]string{"apiVersion", "kind", "metadata"}, k) {
					t.Errorf("%s: %s: unexpected field %q", ov.Name, o, k)
				}
			}
			if ov.find("Service", o.Name) == nil {
				t.Errorf("%s: %s exports no Service", ov.Name, o)
			}
		}
	}
}

// readRepoFile reads a file of the repository.
func readRepoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
