package admin_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

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

// TestWriterIdentity: over mutual TLS, only an operator's certificate may
// change the fleet's configuration, overrides and plan assignments
// (PERMISSION_DENIED for a region's, a coordinator's, a gateway's), and
// what an operator changes is recorded under the operator its certificate
// names, whatever author the request gives. Reads stay open to every
// verified certificate.
func TestWriterIdentity(t *testing.T) {
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
	srv := admin.New(admin.Options{Store: etcdstore.New(cli, "")})
	t.Cleanup(srv.Close)

	pki := testpki.New(t)
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "coordinator", testpki.Leaf{IPs: testpki.Loopback,
		URIs: []string{"spiffe://allot/coordinator/c1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.RequireAndVerifyClientCert) // as allot coordinator serves
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	srv.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	dial := func(name, uri string) allotv1.AdminClient {
		s, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, name, testpki.Leaf{URIs: []string{uri}})), tlsx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(l.Addr().String(), s.DialOption(""))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return allotv1.NewAdminClient(cc)
	}
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
		if _, err := c.cl.History(ctx, &allotv1.HistoryRequest{}); err != nil {
			t.Errorf("%s: History (a read): %v", c.name, err)
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
