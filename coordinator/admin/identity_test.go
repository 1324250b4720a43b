package admin_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/coordinator/admin"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func loopbackURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// tlsAdmin is a coordinator's Admin API served over mutual TLS, as
// allot coordinator serves it.
type tlsAdmin struct {
	pki  *testpki.PKI
	addr string
	reg  *prometheus.Registry
}

func startTLSAdmin(t *testing.T, policy *tlsx.Policy) *tlsAdmin {
	t.Helper()
	client, peer := loopbackURL(t), loopbackURL(t)
	e, err := etcdstore.StartEmbedded(t.TempDir(), client, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	a := &tlsAdmin{pki: testpki.New(t), reg: prometheus.NewRegistry()}
	srv := admin.New(admin.Options{Store: etcdstore.New(cli, ""), Authorization: policy, Registry: a.reg})
	t.Cleanup(srv.Close)

	src, err := tlsx.NewSource(tlsx.Files(a.pki.Issue(t, "coordinator", testpki.Leaf{IPs: testpki.Loopback,
		URIs: []string{"spiffe://allot/coordinator/c1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.RequireAndVerifyClientCert) // as allot coordinator serves
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)...)
	srv.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	a.addr = l.Addr().String()
	return a
}

// dial is a client of the Admin API with a certificate naming uri.
func (a *tlsAdmin) dial(t *testing.T, name, uri string) allotv1.AdminClient {
	t.Helper()
	s, err := tlsx.NewSource(tlsx.Files(a.pki.Issue(t, name, testpki.Leaf{URIs: []string{uri}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(a.addr, s.DialOption(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return allotv1.NewAdminClient(cc)
}

// refusals is the value of allot_coordinator_authorization_refusals_total
// by its role and caller labels ("role/caller").
func (a *tlsAdmin) refusals(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "allot_coordinator_authorization_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["role"]+"/"+l["caller"]] += m.GetCounter().GetValue()
		}
	}
	return out
}

// TestWriterIdentity: over mutual TLS, only an operator's certificate may
// change the fleet's configuration, overrides and plan assignments
// (PERMISSION_DENIED for a region's, a coordinator's, a gateway's), and
// what an operator changes is recorded under the operator its certificate
// names, whatever author the request gives.
func TestWriterIdentity(t *testing.T) {
	a := startTLSAdmin(t, nil)
	dial := func(name, uri string) allotv1.AdminClient { return a.dial(t, name, uri) }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alice := dial("alice", "spiffe://allot/operator/alice")
	apply := &allotv1.ApplyConfigRequest{Yaml: limitsYAML, File: "limits.yaml", Author: "mallory"}
	override := &allotv1.SetOverrideRequest{Override: &allotv1.Override{Domain: "api", Limit: "per-user", Match: key("user", "42"),
		Multiplier: 2, Reason: "test", Author: "mallory"}, Ttl: durationpb.New(time.Minute)}

	// Not an operator: every write refused, nothing stored.
	for _, c := range []struct {
		name string
		cl   allotv1.AdminClient
	}{
		{"a region instance", dial("us-east", "spiffe://allot/region/us-east/instance/i1")},
		{"a coordinator", dial("c2", "spiffe://allot/coordinator/c2")},
		{"a gateway", dial("gw", "spiffe://allot/region/us-east/gateway/gw1")},
		{"no identity", dial("anon", "https://example.com/not-spiffe")},
	} {
		_, err := c.cl.ApplyConfig(ctx, apply)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: ApplyConfig: got %v, want PermissionDenied", c.name, err)
			continue
		}
		t.Logf("%s: ApplyConfig: %v", c.name, err)
		if _, err := c.cl.SetOverride(ctx, override); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: SetOverride: got %v, want PermissionDenied", c.name, err)
		}
		if _, err := c.cl.Rollback(ctx, &allotv1.RollbackRequest{Version: 1}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: Rollback: got %v, want PermissionDenied", c.name, err)
		}
		if _, err := c.cl.DeleteOverride(ctx, &allotv1.DeleteOverrideRequest{Domain: "api", Limit: "per-user", Match: key("user", "42")}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: DeleteOverride: got %v, want PermissionDenied", c.name, err)
		}
		shadow := true
		if _, err := c.cl.UpdateLimit(ctx, &allotv1.UpdateLimitRequest{Domain: "api", Limit: "per-user", Shadow: &shadow}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: UpdateLimit: got %v, want PermissionDenied", c.name, err)
		}
		if _, err := c.cl.AssignPlan(ctx, &allotv1.AssignPlanRequest{Assignment: &allotv1.PlanAssignment{Domain: "api", Match: key("tenant", "acme"), Plan: "pro"}}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: AssignPlan: got %v, want PermissionDenied", c.name, err)
		}
		if _, err := c.cl.UnassignPlan(ctx, &allotv1.UnassignPlanRequest{Domain: "api", Match: key("tenant", "acme")}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: UnassignPlan: got %v, want PermissionDenied", c.name, err)
		}
	}
	if h, err := alice.History(ctx, &allotv1.HistoryRequest{}); err != nil || len(h.GetVersions()) != 0 {
		t.Fatalf("history after refused writes: %v, %v; want none", h, err)
	}

	// An operator: the writes are recorded under the certificate's name.
	resp, err := alice.ApplyConfig(ctx, apply)
	if err != nil {
		t.Fatalf("alice's ApplyConfig: %v", err)
	}
	if got := resp.GetVersion().GetAuthor(); got != "alice" {
		t.Errorf("version %d applied by %q, want alice (the request said mallory)", resp.GetVersion().GetVersion(), got)
	}
	h, err := alice.History(ctx, &allotv1.HistoryRequest{})
	if err != nil || len(h.GetVersions()) != 1 || h.GetVersions()[0].GetAuthor() != "alice" {
		t.Errorf("history: %v, %v; want one version by alice", h, err)
	}
	o, err := alice.SetOverride(ctx, override)
	if err != nil {
		t.Fatalf("alice's SetOverride: %v", err)
	}
	if o.GetAuthor() != "alice" {
		t.Errorf("override by %q, want alice", o.GetAuthor())
	}
	os, err := alice.ListOverrides(ctx, &allotv1.ListOverridesRequest{Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range os.GetOverrides() {
		if !o.GetFromFile() && o.GetAuthor() != "alice" {
			t.Errorf("stored override by %q, want alice", o.GetAuthor())
		}
	}
	pa, err := alice.AssignPlan(ctx, &allotv1.AssignPlanRequest{Assignment: &allotv1.PlanAssignment{Domain: "api", Match: key("tenant", "acme"), Plan: "pro", Author: "mallory"}})
	if err != nil {
		t.Fatalf("alice's AssignPlan: %v", err)
	}
	if pa.GetAuthor() != "alice" {
		t.Errorf("plan assignment by %q, want alice", pa.GetAuthor())
	}
}

// TestReaderRoles: over mutual TLS, the coordinator's Admin reads
// (GetConfig, History, ListOverrides, ListPlans, Usage, Status) need the
// viewer role: an operator's and a coordinator's certificates have it,
// and a certificate granted it (tlsx.Policy.Grants) may read but not
// write; a region's, a gateway's, a client's and a certificate of no
// identity are refused with PERMISSION_DENIED, counted by role and
// caller. A certificate granted operator may write, and is the author of
// what it writes.
func TestReaderRoles(t *testing.T) {
	a := startTLSAdmin(t, &tlsx.Policy{Grants: []tlsx.Grant{
		{URI: "spiffe://allot/client/dashboard", Roles: tlsx.RoleViewer},
		{URI: "spiffe://allot/client/deployer", Roles: tlsx.RoleOperator},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reads := map[string]func(allotv1.AdminClient) error{
		"GetConfig": func(c allotv1.AdminClient) error { _, err := c.GetConfig(ctx, &allotv1.GetConfigRequest{}); return err },
		"History":   func(c allotv1.AdminClient) error { _, err := c.History(ctx, &allotv1.HistoryRequest{}); return err },
		"ListOverrides": func(c allotv1.AdminClient) error {
			_, err := c.ListOverrides(ctx, &allotv1.ListOverridesRequest{})
			return err
		},
		"ListPlans": func(c allotv1.AdminClient) error { _, err := c.ListPlans(ctx, &allotv1.ListPlansRequest{}); return err },
		"Usage": func(c allotv1.AdminClient) error {
			_, err := c.Usage(ctx, &allotv1.UsageRequest{Domain: "api", Descriptor_: key("user", "42")})
			return err
		},
		"Status": func(c allotv1.AdminClient) error { _, err := c.Status(ctx, &allotv1.StatusRequest{}); return err },
	}
	deployer := a.dial(t, "deployer", "spiffe://allot/client/deployer")
	resp, err := deployer.ApplyConfig(ctx, &allotv1.ApplyConfigRequest{Yaml: limitsYAML, File: "limits.yaml", Author: "mallory"})
	if err != nil {
		t.Fatalf("ApplyConfig with a certificate granted operator: %v", err)
	}
	if got := resp.GetVersion().GetAuthor(); got != "spiffe://allot/client/deployer" {
		t.Errorf("version applied by %q, want the certificate's URI", got)
	}

	refused := []struct{ name, uri string }{
		{"a region instance", "spiffe://allot/region/us-east/instance/i1"},
		{"a gateway", "spiffe://allot/region/us-east/gateway/gw1"},
		{"a client", "spiffe://allot/client/billing"},
		{"no identity", "https://example.com/not-spiffe"},
	}
	for _, c := range refused {
		cl := a.dial(t, c.name, c.uri)
		for m, read := range reads {
			if err := read(cl); status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s: %s: got %v, want PermissionDenied", c.name, m, err)
			}
		}
	}
	for _, c := range []struct{ name, uri string }{
		{"an operator", "spiffe://allot/operator/alice"},
		{"a coordinator", "spiffe://allot/coordinator/c2"},
		{"a client granted viewer", "spiffe://allot/client/dashboard"},
		{"a client granted operator", "spiffe://allot/client/deployer"},
	} {
		cl := a.dial(t, c.name, c.uri)
		for m, read := range reads {
			if err := read(cl); err != nil {
				t.Errorf("%s: %s: %v", c.name, m, err)
			}
		}
	}
	dashboard := a.dial(t, "dashboard", "spiffe://allot/client/dashboard")
	if _, err := dashboard.ApplyConfig(ctx, &allotv1.ApplyConfigRequest{Yaml: limitsYAML}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ApplyConfig by a viewer: got %v, want PermissionDenied", err)
	}
	got := a.refusals(t)
	want := map[string]float64{"viewer/instance": 6, "viewer/gateway": 6, "viewer/client": 6, "viewer/anonymous": 6, "operator/client": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("refusals %s: %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}

// TestEveryAdminMethodHasARole: every method of allot.v1.Admin needs a
// role over TLS; one missing from the table would be refused to all.
func TestEveryAdminMethodHasARole(t *testing.T) {
	for _, m := range allotv1.Admin_ServiceDesc.Methods {
		if admin.MethodRole("/allot.v1.Admin/"+m.MethodName) == 0 {
			t.Errorf("allot.v1.Admin/%s has no role", m.MethodName)
		}
	}
}
