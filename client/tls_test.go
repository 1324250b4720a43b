package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// TestTLS: a Client with Config.TLS from TLSFromEnv decides through an
// enforcer that serves TLS only; without TLS it gets no answer (and
// on_failure decides); without the variables TLSFromEnv is nil.
func TestTLS(t *testing.T) {
	pki := testpki.New(t)
	l, _ := tlsEnforcer(t, pki, tlsx.Options{})

	if c, err := client.TLSFromEnv(); c != nil || err != nil {
		t.Fatalf("TLSFromEnv without variables: %v, %v; want nil, nil", c, err)
	}
	gw := pki.Issue(t, "gateway", testpki.Leaf{URIs: []string{"spiffe://allot/region/r/gateway/gw1"}})
	t.Setenv("ALLOT_TLS_CA", gw.CA)
	t.Setenv("ALLOT_TLS_CERT", gw.Cert)
	t.Setenv("ALLOT_TLS_KEY", gw.Key)
	tcfg, err := client.TLSFromEnv()
	if err != nil || tcfg == nil {
		t.Fatalf("TLSFromEnv: %v, %v", tcfg, err)
	}
	for _, c := range []struct {
		name string
		tls  bool
	}{{"TLS", true}, {"plain text", false}} {
		conf := client.Config{Addrs: []string{l.Addr().String()}, Timeout: 2 * time.Second}
		if c.tls {
			conf.TLS = tcfg
		}
		cl, err := client.New(conf)
		if err != nil {
			t.Fatal(err)
		}
		// login is exact: every call goes to the enforcer.
		d := cl.Allow(context.Background(), "api", one("login", "alice"), 1)
		cl.Close()
		if c.tls && (d.Err != nil || !d.Allowed) {
			t.Errorf("%s: %+v, want admitted by the enforcer", c.name, d)
		}
		if !c.tls && d.Err == nil {
			t.Errorf("%s to a TLS enforcer: %+v, want an error", c.name, d)
		}
	}
}

// tlsEnforcer serves an enforcer of sdkConfig over TLS only, with a
// certificate of pki's for loopback, and returns its listener and source.
func tlsEnforcer(t *testing.T, pki *testpki.PKI, opts tlsx.Options) (net.Listener, *tlsx.Source) {
	t.Helper()
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "enforcer", testpki.Leaf{IPs: testpki.Loopback})), opts)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := src.ServerOptions(0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := allot.ParseConfig("sdk.yaml", []byte(sdkConfig))
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(regional.New(cfg, regional.Options{}), server.Options{Region: "r"})
	gs := grpc.NewServer(creds...)
	svc.RegisterGRPC(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l, src
}

// TestCredentialsFollowARotatedCA: the enforcers' CA is rotated (the
// bundle file gains the new CA, the enforcer's certificate is signed by
// it). A client made before, with CredentialsFromEnv, verifies the new
// certificate on its next connection; one with TLSFromEnv's fixed pool
// does not.
func TestCredentialsFollowARotatedCA(t *testing.T) {
	pki := testpki.New(t)
	l, src := tlsEnforcer(t, pki, tlsx.Options{Interval: 10 * time.Millisecond})

	t.Setenv("ALLOT_TLS_CA", pki.CAFile)
	dynamic, err := client.CredentialsFromEnv()
	if err != nil || dynamic == nil {
		t.Fatalf("CredentialsFromEnv: %v, %v", dynamic, err)
	}
	fixed, err := client.TLSFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	allow := func(conf client.Config) client.Decision {
		conf.Addrs, conf.Timeout = []string{l.Addr().String()}, 2*time.Second
		cl, err := client.New(conf)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		return cl.Allow(context.Background(), "api", one("login", "alice"), 1) // exact: asks the enforcer
	}
	if d := allow(client.Config{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(dynamic)}}); d.Err != nil {
		t.Fatalf("before the rotation: %+v", d)
	}
	pki.RotateCA(t)
	pki.Issue(t, "enforcer", testpki.Leaf{IPs: testpki.Loopback})
	deadline := time.Now().Add(10 * time.Second)
	for src.Certificate().Issuer.SerialNumber != pki.CA.Subject.SerialNumber && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var d client.Decision
	for {
		if d = allow(client.Config{DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(dynamic)}}); d.Err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d.Err != nil {
		t.Fatalf("after the rotation, CredentialsFromEnv: %+v, want the new CA trusted", d)
	}
	if d := allow(client.Config{TLS: fixed}); d.Err == nil {
		t.Fatalf("after the rotation, TLSFromEnv's fixed pool: %+v, want the new certificate refused", d)
	}
}
