package main

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// statusOnly answers Status with the identity of its caller in the
// configuration's author.
type statusOnly struct {
	allotv1.UnimplementedAdminServer
}

func (statusOnly) Status(ctx context.Context, _ *allotv1.StatusRequest) (*allotv1.StatusResponse, error) {
	id, err := tlsx.PeerIdentity(ctx)
	if err != nil {
		return nil, err
	}
	return &allotv1.StatusResponse{Config: &allotv1.ConfigVersion{Version: 3, Author: id.Operator}}, nil
}

// TestTLS: allotctl reaches an Admin API that requires client
// certificates with --tls-* flags or ALLOT_TLS_* variables, and the
// server sees the operator's identity; without a certificate, or in plain
// text, it fails; --insecure to an address that is not a loopback one is
// refused before dialling.
func TestTLS(t *testing.T) {
	pki := testpki.New(t)
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "coordinator", testpki.Leaf{IPs: testpki.Loopback})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.RequireAndVerifyClientCert)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)...)
	allotv1.RegisterAdminServer(gs, statusOnly{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	addr := l.Addr().String()
	alice := pki.Issue(t, "alice", testpki.Leaf{URIs: []string{"spiffe://allot/operator/alice"}})

	mustCtl(t, []string{"--addr", addr, "--tls-ca", alice.CA, "--tls-cert", alice.Cert, "--tls-key", alice.Key, "status"}, "configuration: version 3")
	out := mustCtl(t, []string{"status", "--addr", addr, "--tls-ca", alice.CA, "--tls-cert", alice.Cert, "--tls-key", alice.Key, "-o", "json"})
	if !strings.Contains(out, `"author":"alice"`) && !strings.Contains(out, `"author": "alice"`) {
		t.Errorf("the server did not see the operator's identity:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--addr", addr, "--tls-ca", alice.CA}, "unreachable"},
		{[]string{"status", "--addr", addr}, "plain text needs --insecure"},
		{[]string{"status", "--addr", addr, "--insecure"}, "unreachable"},
		{[]string{"status", "--addr", addr, "--tls-cert", alice.Cert}, "--tls-cert and --tls-key go together"},
		{[]string{"status", "--addr", addr, "--insecure", "--tls-ca", alice.CA}, "exclusive"},
		{[]string{"status", "--addr", "192.0.2.1:8070", "--insecure"}, "--insecure is only allowed on loopback addresses"},
	} {
		if _, err := ctl(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("allotctl %s: %v, want an error with %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	t.Setenv("ALLOT_TLS_CA", alice.CA)
	t.Setenv("ALLOT_TLS_CERT", alice.Cert)
	t.Setenv("ALLOT_TLS_KEY", alice.Key)
	mustCtl(t, []string{"status", "--addr", addr}, "configuration: version 3")
}
