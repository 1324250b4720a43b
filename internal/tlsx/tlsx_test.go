package tlsx_test

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// fast checks the files at every handshake after 10ms, so that a test
// does not wait the default second.
var fast = tlsx.Options{Interval: 10 * time.Millisecond}

func source(t *testing.T, f testpki.Files) *tlsx.Source {
	t.Helper()
	s, err := tlsx.NewSource(tlsx.Files(f), fast)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveHTTP serves, over TLS from src, the serial number of the caller's
// verified certificate ("-" without one).
func serveHTTP(t *testing.T, src *tlsx.Source) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := tlsx.RequestCertificate(r)
		if err != nil {
			io.WriteString(w, "-")
			return
		}
		io.WriteString(w, c.SerialNumber.String())
	})}
	go src.ServeHTTP(hs, l)
	t.Cleanup(func() { hs.Close() })
	return l.Addr().String()
}

// TestRotationUnderLoad rotates the server's and the client's
// certificates while a loop of HTTPS calls (a new handshake each) runs:
// no call fails, and calls after the rotation see both new certificates.
func TestRotationUnderLoad(t *testing.T) {
	pki := testpki.New(t)
	srvFiles := pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
	cliFiles := pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/operator/alice"}})
	srv, cli := source(t, srvFiles), source(t, cliFiles)
	addr := serveHTTP(t, srv)
	hc, scheme := cli.HTTPClient("")
	hc.Transport.(*http.Transport).DisableKeepAlives = true // every call is a handshake
	hc.Timeout = 5 * time.Second

	type seen struct{ server, client string }
	var (
		mu       sync.Mutex
		last     seen
		calls    atomic.Int64
		failures []error
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := hc.Get(scheme + "://" + addr + "/")
				var body []byte
				if err == nil {
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				calls.Add(1)
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
				} else {
					last = seen{resp.TLS.PeerCertificates[0].SerialNumber.String(), string(body)}
				}
				mu.Unlock()
			}
		})
	}
	current := func() seen { mu.Lock(); defer mu.Unlock(); return last }
	waitFor(t, func() bool { return calls.Load() > 20 })
	before := current()
	if before.server != srv.Certificate().SerialNumber.String() || before.client != cli.Certificate().SerialNumber.String() {
		t.Fatalf("before rotation: saw %+v", before)
	}
	// Rotate both, five times, as a renewal job would (certificate first,
	// then key: in between they do not match and are refused), each time
	// until calls see the new pair.
	for range 5 {
		pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
		pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/operator/alice"}})
		want := seen{readSerial(t, srvFiles.Cert), readSerial(t, cliFiles.Cert)}
		waitFor(t, func() bool { return current() == want })
	}
	after := current()
	n := calls.Load()
	waitFor(t, func() bool { return calls.Load() > n+20 }) // and a few more after the last one
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed across the rotation; first: %v", len(failures), calls.Load(), failures[0])
	}
	t.Logf("%d calls, none failed; certificates %+v → %+v", calls.Load(), before, after)
}

func readSerial(t *testing.T, path string) string {
	t.Helper()
	s, err := tlsx.NewSource(tlsx.Files{Cert: path, Key: strings.TrimSuffix(path, ".crt") + ".key"}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Certificate().SerialNumber.String()
}

// waitFor polls cond for at most 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBadFilesKeepTheOldCertificate: a certificate that does not load
// (garbage, a key of another certificate) is refused and the one in
// force stays; once the files are right again they are loaded.
func TestBadFilesKeepTheOldCertificate(t *testing.T) {
	pki := testpki.New(t)
	f := pki.Issue(t, "server", testpki.Leaf{})
	now := time.Unix(1e9, 0)
	clock := func() time.Time { return now }
	src, err := tlsx.NewSource(tlsx.Files(f), tlsx.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	first := src.Certificate().SerialNumber

	testpki.WriteFile(t, f.Cert, []byte("not a certificate"))
	now = now.Add(2 * time.Second)
	if got := src.Certificate().SerialNumber; got.Cmp(first) != 0 {
		t.Fatalf("garbage certificate: serial %v in force, want %v", got, first)
	}
	if err := src.Reload(); err == nil {
		t.Fatal("Reload of a garbage certificate: no error")
	}
	// A new certificate with the old key: they do not match.
	cert, _ := pki.Sign(t, "server", testpki.Leaf{})
	testpki.WriteFile(t, f.Cert, cert)
	now = now.Add(2 * time.Second)
	if got := src.Certificate().SerialNumber; got.Cmp(first) != 0 {
		t.Fatalf("mismatched key: serial %v in force, want %v", got, first)
	}
	// Within the interval nothing is looked at; after it the good pair is loaded.
	pki.Issue(t, "server", testpki.Leaf{})
	now = now.Add(500 * time.Millisecond)
	if got := src.Certificate().SerialNumber; got.Cmp(first) != 0 {
		t.Fatalf("within the interval: serial %v, want %v still", got, first)
	}
	now = now.Add(time.Second)
	if got := src.Certificate().SerialNumber; got.Cmp(first) == 0 {
		t.Fatal("a good pair after the interval was not loaded")
	}
	if _, err := tlsx.NewSource(tlsx.Files{Cert: f.Cert}, tlsx.Options{}); !errors.Is(err, tlsx.ErrNoCert) {
		t.Fatalf("certificate without key: %v, want ErrNoCert", err)
	}
	if _, err := tlsx.NewSource(tlsx.Files{CA: f.Key}, tlsx.Options{}); err == nil {
		t.Fatal("a key as CA bundle: no error")
	}
}

// grpcServer serves the health service over TLS from src with auth, and
// requires client certificates for it (as for Peer, Coordinator and Admin).
// It records the identity of the last caller.
func grpcServer(t *testing.T, src *tlsx.Source, auth tls.ClientAuthType, lastID *atomic.Value) string {
	t.Helper()
	opts, err := src.ServerOptions(auth)
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, tlsx.RequireClientCert("grpc.health.v1.Health")...)
	opts = append(opts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		id, err := tlsx.PeerIdentity(ctx)
		lastID.Store(fmt.Sprintf("%s %v", id.Kind(), err))
		return h(ctx, req)
	}))
	gs := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return l.Addr().String()
}

func healthCheck(addr string, creds grpc.DialOption, call ...grpc.CallOption) error {
	cc, err := grpc.NewClient(addr, creds)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, call...)
	return err
}

// TestMutualTLSOverGRPC: a mutual service refuses a TLS caller without a
// client certificate, and one whose certificate another CA signed; it
// serves a caller with one and sees its identity; a client that does
// not trust the server's CA fails.
func TestMutualTLSOverGRPC(t *testing.T) {
	pki := testpki.New(t)
	srv := source(t, pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback}))
	var lastID atomic.Value
	addr := grpcServer(t, srv, tls.VerifyClientCertIfGiven, &lastID)

	with := source(t, pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}}))
	if err := healthCheck(addr, with.DialOption("")); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	if got := lastID.Load(); got != "instance <nil>" {
		t.Fatalf("identity seen: %v, want instance", got)
	}
	without := source(t, testpki.Files{CA: pki.CAFile})
	if err := healthCheck(addr, without.DialOption("")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a client certificate: %v, want Unauthenticated", err)
	}
	other := testpki.New(t)
	stranger := source(t, testpki.Files{Cert: other.Issue(t, "client", testpki.Leaf{}).Cert, Key: other.Dir + "/client.key", CA: pki.CAFile})
	if err := healthCheck(addr, stranger.DialOption("")); status.Code(err) != codes.Unavailable {
		t.Fatalf("a client certificate of another CA: %v, want a failed handshake", err)
	}
	distrust := source(t, testpki.Files{CA: other.CAFile})
	if err := healthCheck(addr, distrust.DialOption("")); status.Code(err) != codes.Unavailable {
		t.Fatalf("a client that does not trust the server's CA: %v, want a failed handshake", err)
	}
	// The certificate names 127.0.0.1 and localhost, not this name.
	if err := healthCheck(addr, with.DialOption("elsewhere.example")); status.Code(err) != codes.Unavailable {
		t.Fatalf("--tls-server-name the certificate does not hold: %v, want a failed handshake", err)
	}
	var nilSrc *tlsx.Source
	if err := healthCheck(addr, nilSrc.DialOption("")); status.Code(err) != codes.Unavailable {
		t.Fatalf("plain text to a TLS server: %v, want Unavailable", err)
	}
}

// TestCARotation: the CA bundle gains a new CA and the server gets a
// certificate of the new CA; clients made before it (gRPC credentials)
// and the server's verification of client certificates follow without a
// restart.
func TestCARotation(t *testing.T) {
	pki := testpki.New(t)
	srvFiles := pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
	srv := source(t, srvFiles)
	var lastID atomic.Value
	addr := grpcServer(t, srv, tls.RequireAndVerifyClientCert, &lastID)
	cliFiles := pki.Issue(t, "client", testpki.Leaf{})
	cli := source(t, cliFiles)
	creds := cli.DialOption("")
	if err := healthCheck(addr, creds); err != nil {
		t.Fatal(err)
	}
	pki.RotateCA(t)
	pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
	pki.Issue(t, "client", testpki.Leaf{})
	waitFor(t, func() bool {
		return healthCheck(addr, creds) == nil && srv.Certificate().Issuer.SerialNumber == pki.CA.Subject.SerialNumber &&
			cli.Certificate().Issuer.SerialNumber == pki.CA.Subject.SerialNumber
	})
}

func TestIsLoopback(t *testing.T) {
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"127.1.2.3:80", true},
		{"[::1]:8080", true},
		{"::1", true},
		{"localhost:2379", true},
		{"LOCALHOST", true},
		{"dns:///127.0.0.1:8070", true},
		{"http://127.0.0.1:2379", true},
		{"https://localhost:2379/x", true},
		{":8080", false},
		{"0.0.0.0:8080", false},
		{"[::]:8080", false},
		{"10.0.0.1:8080", false},
		{"coordinator.allot.svc:8070", false},
		{"localhost.example.com:80", false},
		{"dns:///coordinator:8070", false},
		{"", false},
	} {
		if got := tlsx.IsLoopback(c.addr); got != c.want {
			t.Errorf("IsLoopback(%q) = %v, want %v", c.addr, got, c.want)
		}
	}
}

func TestPlaintextRule(t *testing.T) {
	for _, c := range []struct {
		addr     string
		insecure bool
		want     error
	}{
		{"127.0.0.1:8080", true, nil},
		{"127.0.0.1:8080", false, tlsx.ErrPlaintext},
		{"0.0.0.0:8080", true, tlsx.ErrNotLoopback},
		{":8080", true, tlsx.ErrNotLoopback},
		{"0.0.0.0:8080", false, tlsx.ErrPlaintext},
	} {
		for name, rule := range map[string]func(string, string, bool) error{"listen": tlsx.ListenRule, "dial": tlsx.DialRule} {
			err := rule("grpc", c.addr, c.insecure)
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Errorf("%s %s insecure=%v: %v, want %v", name, c.addr, c.insecure, err, c.want)
			}
		}
	}
}

// TestPlainAndLinkRule: the rules apply to
// every plain-text address, so plain text without --insecure is refused
// on loopback too; LinkRule lets a TLS process reach etcd or Redis
// without their TLS on loopback only.
func TestPlainAndLinkRule(t *testing.T) {
	if err := tlsx.ListenRule("grpc", "127.0.0.1:8081", false); !errors.Is(err, tlsx.ErrPlaintext) {
		t.Errorf("plain text on loopback without --insecure: %v, want ErrPlaintext", err)
	}
	if err := tlsx.DialRule("--redis", "127.0.0.1:6379", true); err != nil {
		t.Errorf("--insecure to loopback: %v", err)
	}
	for addr, want := range map[string]error{"127.0.0.1:6379": nil, "localhost:2379": nil, "[::1]:6379": nil,
		"redis:6379": tlsx.ErrPlainLink, "10.0.0.7:6379": tlsx.ErrPlainLink, ":6379": tlsx.ErrPlainLink} {
		if err := tlsx.LinkRule("--redis", addr); !errors.Is(err, want) || (err == nil) != (want == nil) {
			t.Errorf("LinkRule(%s): %v, want %v", addr, err, want)
		}
	}
}

func TestParseIdentity(t *testing.T) {
	for _, c := range []struct {
		uri  string
		want tlsx.Identity // URI is filled in
		kind string
		bad  bool
	}{
		{uri: "spiffe://allot/region/us-east/instance/i1", want: tlsx.Identity{TrustDomain: "allot", Region: "us-east", Instance: "i1"}, kind: "instance"},
		{uri: "spiffe://allot/coordinator/c1", want: tlsx.Identity{TrustDomain: "allot", Coordinator: "c1"}, kind: "coordinator"},
		{uri: "spiffe://prod.example/operator/alice", want: tlsx.Identity{TrustDomain: "prod.example", Operator: "alice"}, kind: "operator"},
		{uri: "spiffe://allot/region/eu-west/gateway/gw1", want: tlsx.Identity{TrustDomain: "allot", Region: "eu-west", Gateway: "gw1"}, kind: "gateway"},
		{uri: "spiffe://allot/region/eu-west", want: tlsx.Identity{TrustDomain: "allot", Region: "eu-west"}, kind: "region"},
		{uri: "spiffe://allot/instance/i1", bad: true},
		{uri: "spiffe://allot/region/us-east/region/eu-west", bad: true},
		{uri: "spiffe://allot/region", bad: true},
		{uri: "spiffe://allot/", bad: true},
		{uri: "spiffe://allot/tenant/acme", bad: true},
		{uri: "spiffe://allot/coordinator/c1/operator/bob", bad: true},
		{uri: "spiffe:///operator/bob", bad: true},
		{uri: "spiffe://allot/operator/bob?x=1", bad: true},
		{uri: "https://allot/operator/bob", bad: true},
	} {
		u, err := url.Parse(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tlsx.ParseIdentityURI(u)
		if c.bad {
			if !errors.Is(err, tlsx.ErrNoIdentity) {
				t.Errorf("%s: %+v, %v; want ErrNoIdentity", c.uri, got, err)
			}
			continue
		}
		c.want.URI = c.uri
		if err != nil || got != c.want || got.Kind() != c.kind {
			t.Errorf("%s: %+v (%s), %v; want %+v (%s)", c.uri, got, got.Kind(), err, c.want, c.kind)
		}
	}
}

func TestFlags(t *testing.T) {
	pki := testpki.New(t)
	f := pki.Issue(t, "x", testpki.Leaf{})
	for _, c := range []struct {
		flags       tlsx.Flags
		server, tls bool
		bad         bool
	}{
		{flags: tlsx.Flags{}, server: true},
		{flags: tlsx.Flags{Insecure: true}, server: true},
		{flags: tlsx.Flags{Files: tlsx.Files(f)}, server: true, tls: true},
		{flags: tlsx.Flags{Files: tlsx.Files{Cert: f.Cert, Key: f.Key}}, server: true, bad: true},
		{flags: tlsx.Flags{Files: tlsx.Files{Cert: f.Cert, Key: f.Key}}, tls: true},
		{flags: tlsx.Flags{Files: tlsx.Files{CA: f.CA}}, tls: true},
		{flags: tlsx.Flags{Files: tlsx.Files{Cert: f.Cert, CA: f.CA}}, bad: true},
		{flags: tlsx.Flags{Files: tlsx.Files(f), Insecure: true}, bad: true},
	} {
		load := c.flags.Source
		if c.server {
			load = c.flags.ServerSource
		}
		src, err := load(nil)
		if (err != nil) != c.bad || !c.bad && (src != nil) != c.tls {
			t.Errorf("%+v server=%v: source %v, %v", c.flags, c.server, src != nil, err)
		}
	}
	t.Setenv("ALLOT_TLS_CA", f.CA)
	t.Setenv("ALLOT_INSECURE", "true")
	var fl tlsx.Flags
	fs := flagSet()
	fl.Register(fs, "", "allotctl", true)
	if fl.CA != f.CA || !fl.Insecure {
		t.Fatalf("defaults from the environment: %+v", fl)
	}
	var etcd tlsx.Flags
	etcd.Register(fs, "etcd-", "etcd", false)
	if err := fs.Parse([]string{"--etcd-tls-ca", f.CA, "--insecure=false"}); err != nil || etcd.CA != f.CA || fl.Insecure {
		t.Fatalf("parse: %v %+v %+v", err, etcd, fl)
	}
}

func flagSet() *flag.FlagSet { return flag.NewFlagSet("test", flag.ContinueOnError) }

// TestRotationUnderLoadGRPC: the same over gRPC with mutual TLS required
// in the handshake, a new connection per call (as a redial after a
// restart of the other side would be), and a long-lived connection that
// keeps working across the rotations.
func TestRotationUnderLoadGRPC(t *testing.T) {
	pki := testpki.New(t)
	srvFiles := pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
	cliFiles := pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})
	srv, cli := source(t, srvFiles), source(t, cliFiles)
	var lastID atomic.Value
	addr := grpcServer(t, srv, tls.RequireAndVerifyClientCert, &lastID)
	creds := cli.DialOption("")
	long, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()

	var calls atomic.Int64
	var mu sync.Mutex
	var failures []error
	var seen atomic.Value // the serial of the server certificate the latest new connection got
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if i == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err = healthpb.NewHealthClient(long).Check(ctx, &healthpb.HealthCheckRequest{})
					cancel()
				} else {
					var p peer.Peer
					if err = healthCheck(addr, creds, grpc.Peer(&p)); err == nil {
						seen.Store(p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String())
					}
				}
				calls.Add(1)
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		})
	}
	for range 5 {
		n := calls.Load()
		pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
		pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})
		want := readSerial(t, srvFiles.Cert)
		waitFor(t, func() bool { return seen.Load() == want && calls.Load() > n+10 })
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed across the rotations; first: %v", len(failures), calls.Load(), failures[0])
	}
	t.Logf("%d gRPC calls across 5 rotations, none failed", calls.Load())
}
