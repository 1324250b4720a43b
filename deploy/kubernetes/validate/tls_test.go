package validate

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// csiDriver is cert-manager's csi-driver, which gives every pod its own
// certificate (base/tls.yaml).
const csiDriver = "csi.cert-manager.io"

// csiAttributes are the volume attributes the manifests may use, of
// cert-manager csi-driver's (an unknown one, a misspelling, is refused).
var csiAttributes = []string{
	"csi.cert-manager.io/issuer-name", "csi.cert-manager.io/issuer-kind", "csi.cert-manager.io/issuer-group",
	"csi.cert-manager.io/common-name", "csi.cert-manager.io/dns-names", "csi.cert-manager.io/ip-sans",
	"csi.cert-manager.io/uri-sans", "csi.cert-manager.io/duration", "csi.cert-manager.io/renew-before",
	"csi.cert-manager.io/key-usages", "csi.cert-manager.io/fs-group", "csi.cert-manager.io/key-encoding",
	"csi.cert-manager.io/certificate-file", "csi.cert-manager.io/privatekey-file", "csi.cert-manager.io/ca-file",
}

// keyUsages are cert-manager's names of the key usages used here.
var keyUsages = []string{"digital signature", "key encipherment", "server auth", "client auth"}

// TestIssuer checks the cert-manager Issuer (no Go types here): a CA
// Issuer reading a Secret, and nothing else.
func TestIssuer(t *testing.T) {
	for _, ov := range overlays(t) {
		issuers := ov.ofKind("Issuer")
		if len(issuers) != 1 || issuers[0].Name != "allot-ca" {
			t.Fatalf("%s: want one Issuer allot-ca, got %v", ov.Name, issuers)
		}
		o := issuers[0]
		for k := range o.Raw {
			if !slices.Contains([]string{"apiVersion", "kind", "metadata", "spec"}, k) {
				t.Errorf("%s: %s: unexpected field %q", ov.Name, o, k)
			}
		}
		spec, _ := o.Raw["spec"].(map[string]any)
		ca, _ := spec["ca"].(map[string]any)
		if len(spec) != 1 || len(ca) != 1 || ca["secretName"] != "allot-ca" {
			t.Errorf("%s: %s: spec %v, want {ca: {secretName: allot-ca}}", ov.Name, o, spec)
		}
	}
}

// TestMutualTLS: every workload of allot, etcd and Redis has its own
// certificate from the Issuer (a csi.cert-manager.io volume, mounted),
// named by the identity convention (docs/security.md): an enforcer
// spiffe://allot/region/REGION/instance/${POD_NAME} with
// --instance=$(POD_NAME), a coordinator spiffe://allot/coordinator/${POD_NAME},
// the limits Job an operator; allot's processes run with --tls-cert,
// --tls-key and --tls-ca from it, and so do their etcd and Redis links;
// none runs --insecure; HTTP probes are HTTPS; etcd's client and peer URLs
// are https with client certificates required; Redis serves TLS only.
func TestMutualTLS(t *testing.T) {
	for _, ov := range overlays(t) {
		for _, w := range workloads(ov) {
			spec := w.template.Spec
			for _, c := range spec.Containers {
				where := fmt.Sprintf("%s: %s: container %s", ov.Name, w, c.Name)
				vol, mount := tlsVolume(spec, c)
				if vol == nil {
					t.Errorf("%s: no %s volume mounted", where, csiDriver)
					continue
				}
				attrs := vol.CSI.VolumeAttributes
				for k := range maps.Keys(attrs) {
					if !slices.Contains(csiAttributes, k) {
						t.Errorf("%s: volume %s: unknown attribute %s", where, vol.Name, k)
					}
				}
				if attrs["csi.cert-manager.io/issuer-name"] != "allot-ca" || attrs["csi.cert-manager.io/issuer-kind"] != "Issuer" {
					t.Errorf("%s: volume %s: issuer %q kind %q, want the Issuer allot-ca", where, vol.Name, attrs["csi.cert-manager.io/issuer-name"], attrs["csi.cert-manager.io/issuer-kind"])
				}
				if vol.CSI.ReadOnly == nil || !*vol.CSI.ReadOnly {
					t.Errorf("%s: volume %s: want readOnly", where, vol.Name)
				}
				usages := strings.Split(attrs["csi.cert-manager.io/key-usages"], ",")
				for _, u := range usages {
					if !slices.Contains(keyUsages, u) {
						t.Errorf("%s: volume %s: key usage %q", where, vol.Name, u)
					}
				}
				if !slices.Contains(usages, "client auth") {
					t.Errorf("%s: volume %s: no client auth: its links present its certificate", where, vol.Name)
				}
				if attrs["csi.cert-manager.io/dns-names"] == "" && attrs["csi.cert-manager.io/uri-sans"] == "" && attrs["csi.cert-manager.io/common-name"] == "" {
					t.Errorf("%s: volume %s: a certificate of no name", where, vol.Name)
				}
				uri := attrs["csi.cert-manager.io/uri-sans"]
				file := func(f string) string { return mount.MountPath + "/" + f }
				args := argFlags(c.Args)
				checkFiles := func(prefix string) {
					for k, f := range map[string]string{"tls-cert": "tls.crt", "tls-key": "tls.key", "tls-ca": "ca.crt"} {
						if args[prefix+k] != file(f) {
							t.Errorf("%s: --%s%s=%q, want %s", where, prefix, k, args[prefix+k], file(f))
						}
					}
				}
				if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(strings.TrimLeft(a, "-"), "insecure") }) {
					t.Errorf("%s: --insecure: plain text on a pod's address is refused", where)
				}
				switch cmd := command(c); cmd {
				case "regional":
					if want := "spiffe://allot/region/" + ov.Name + "/instance/${POD_NAME}"; uri != want {
						t.Errorf("%s: URI SAN %q, want %q", where, uri, want)
					}
					if args["instance"] != "$(POD_NAME)" {
						t.Errorf("%s: --instance=%q, want $(POD_NAME): the instance its certificate names", where, args["instance"])
					}
					checkFiles("")
					checkFiles("etcd-")
					checkFiles("redis-")
					if args["redis-tls-server-name"] == "" || !strings.Contains(redisDNS(ov), args["redis-tls-server-name"]) {
						t.Errorf("%s: --redis-tls-server-name=%q is not a name of the Redis nodes' certificates (%s)", where, args["redis-tls-server-name"], redisDNS(ov))
					}
					if !strings.Contains(attrs["csi.cert-manager.io/dns-names"], "allot-regional,") {
						t.Errorf("%s: the certificate lacks allot-regional, the coordinators' --tls-server-name", where)
					}
				case "coordinator":
					if uri != "spiffe://allot/coordinator/${POD_NAME}" {
						t.Errorf("%s: URI SAN %q", where, uri)
					}
					checkFiles("")
					checkFiles("etcd-")
					if args["tls-server-name"] != "allot-regional" {
						t.Errorf("%s: --tls-server-name=%q, want allot-regional (the regions register pod IPs)", where, args["tls-server-name"])
					}
				case "allotctl":
					if !strings.HasPrefix(uri, "spiffe://allot/operator/") {
						t.Errorf("%s: URI SAN %q, want an operator's: only an operator writes", where, uri)
					}
					checkFiles("")
				case "etcd":
					for k, v := range map[string]string{"cert-file": file("tls.crt"), "key-file": file("tls.key"), "trusted-ca-file": file("ca.crt"),
						"peer-cert-file": file("tls.crt"), "peer-key-file": file("tls.key"), "peer-trusted-ca-file": file("ca.crt"),
						"client-cert-auth": "true", "peer-client-cert-auth": "true"} {
						if args[k] != v {
							t.Errorf("%s: --%s=%q, want %q", where, k, args[k], v)
						}
					}
					for _, k := range []string{"listen-client-urls", "listen-peer-urls", "advertise-client-urls", "initial-advertise-peer-urls"} {
						if !strings.HasPrefix(args[k], "https://") {
							t.Errorf("%s: --%s=%q, want https", where, k, args[k])
						}
					}
				case "redis":
					conf := redisConf(ov)
					for _, l := range []string{"port 0", "tls-port 6379", "tls-auth-clients yes", "tls-replication yes", "tls-cluster yes",
						"tls-cert-file " + file("tls.crt"), "tls-key-file " + file("tls.key"), "tls-ca-cert-file " + file("ca.crt")} {
						if !slices.Contains(strings.Split(conf, "\n"), "    "+l) && !slices.Contains(strings.Split(conf, "\n"), l) {
							t.Errorf("%s: redis.conf lacks %q", where, l)
						}
					}
				case "redis-create":
					if !strings.Contains(strings.Join(c.Args, " "), "--tls --cert "+file("tls.crt")) {
						t.Errorf("%s: redis-cli without --tls and its certificate", where)
					}
				default:
					t.Errorf("%s: unknown command %q", where, cmd)
				}
				for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
					if p != nil && p.HTTPGet != nil && p.HTTPGet.Port.String() == "http" && p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
						t.Errorf("%s: HTTP probe of %s: want scheme HTTPS", where, p.HTTPGet.Path)
					}
				}
			}
		}
		for _, o := range ov.ofKind("ServiceMonitor") {
			for _, e := range o.Raw["spec"].(map[string]any)["endpoints"].([]any) {
				e := e.(map[string]any)
				if e["port"] == "http" && (e["scheme"] != "https" || e["tlsConfig"] == nil) {
					t.Errorf("%s: %s: endpoint %v: want scheme https with a tlsConfig", ov.Name, o, e["port"])
				}
			}
		}
	}
}

// tlsVolume is the csi.cert-manager.io volume c mounts, and its mount.
func tlsVolume(spec corev1.PodSpec, c corev1.Container) (*corev1.Volume, *corev1.VolumeMount) {
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.CSI == nil || v.CSI.Driver != csiDriver {
			continue
		}
		for j := range c.VolumeMounts {
			if c.VolumeMounts[j].Name == v.Name {
				return v, &c.VolumeMounts[j]
			}
		}
	}
	return nil, nil
}

// command names what a container runs: allot's subcommand, allotctl,
// etcd, redis (the server) or redis-create (the cluster's create Job).
func command(c corev1.Container) string {
	switch {
	case len(c.Command) > 0 && strings.HasSuffix(c.Command[0], "allotctl"):
		return "allotctl"
	case len(c.Command) > 0 && strings.HasSuffix(c.Command[0], "etcd"):
		return "etcd"
	case len(c.Command) > 0 && c.Command[0] == "redis-server":
		return "redis"
	case len(c.Command) > 0 && c.Command[0] == "sh" && strings.Contains(strings.Join(c.Args, " "), "redis-cli"):
		return "redis-create"
	case len(c.Command) == 0 && len(c.Args) > 0:
		return c.Args[0]
	}
	return ""
}

// redisConf is the Redis nodes' redis.conf.
func redisConf(ov *overlay) string {
	cm, _ := configMap(ov, "allot-redis")
	if cm == nil {
		return ""
	}
	return cm.Data["redis.conf"]
}

// redisDNS are the DNS names of the Redis nodes' certificates.
func redisDNS(ov *overlay) string {
	o := ov.find("StatefulSet", "allot-redis")
	if o == nil {
		return ""
	}
	for _, w := range workloads(ov) {
		if w.obj == o {
			for _, v := range w.template.Spec.Volumes {
				if v.CSI != nil {
					return v.CSI.VolumeAttributes["csi.cert-manager.io/dns-names"]
				}
			}
		}
	}
	return ""
}
