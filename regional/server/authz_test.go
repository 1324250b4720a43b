package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/peersync"
)

// authzConfig: api allows refunds, closed does not. An hour's rate, so
// that nothing refills within a test.
const authzConfig = `
domain: api
allow_refunds: true
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/h}
---
domain: closed
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/h}
`

const (
	gatewayURI = "spiffe://allot/region/r/gateway/gw1"
	otherGwURI = "spiffe://allot/region/r/gateway/gw2"
	envoyURI   = "spiffe://allot/region/r/gateway/envoy"
	clientURI  = "spiffe://allot/client/app"
)

// authzPolicy: anonymous callers check; the Envoy may refund.
var authzPolicy = &tlsx.Policy{Anonymous: tlsx.RoleCheck, Grants: []tlsx.Grant{{URI: envoyURI, Roles: tlsx.RoleRefund}}}

// tlsEnforcer is region r's gRPC API over TLS on loopback as allot
// regional serves it: client certificates verified when given, required
// for Peer and Admin; the RateLimiter, Envoy's RLS, Admin and Peer.
type tlsEnforcer struct {
	pki  *testpki.PKI
	addr string
	svc  *Service
	reg  *prometheus.Registry
}

func startTLSEnforcer(t *testing.T, policy *tlsx.Policy) *tlsEnforcer {
	t.Helper()
	cfg, err := allot.ParseConfig("authz.yaml", []byte(authzConfig))
	if err != nil {
		t.Fatal(err)
	}
	e := &tlsEnforcer{pki: testpki.New(t), reg: prometheus.NewRegistry()}
	engine := regional.New(cfg, regional.Options{})
	e.svc = New(engine, Options{Region: "r", Registry: e.reg, Authorization: policy})
	src, err := tlsx.NewSource(tlsx.Files(e.pki.Issue(t, "r", testpki.Leaf{IPs: testpki.Loopback,
		URIs: []string{"spiffe://allot/region/r/instance/r1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(tls.VerifyClientCertIfGiven)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(opts, tlsx.RequireClientCert(tlsx.MutualServices...)...)...)
	e.svc.RegisterGRPC(gs)
	e.svc.RegisterAdmin(gs, AdminOptions{})
	peers, err := peersync.New(peersync.Options{Region: "r", Instance: "r1", Engine: engine, Peers: map[string]string{"b": "127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	peers.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(func() { gs.Stop(); peers.Close() })
	e.addr = l.Addr().String()
	return e
}

// dial connects with a certificate naming uri; "" presents none.
func (e *tlsEnforcer) dial(t *testing.T, uri string) *grpc.ClientConn {
	t.Helper()
	files := testpki.Files{CA: e.pki.CAFile}
	if uri != "" {
		files = e.pki.Issue(t, strings.NewReplacer("/", "-", ":", "").Replace(uri), testpki.Leaf{URIs: []string{uri}})
	}
	src, err := tlsx.NewSource(tlsx.Files(files), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(e.addr, src.DialOption(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// left is what user has left in domain, without charging.
func left(t *testing.T, s *Service, domain, user string) int64 {
	t.Helper()
	var dec allot.Decision
	if err := s.Engine().Check(time.Now(), domain, allot.Descriptor{{Key: "user", Value: user}}, 0, &dec); err != nil {
		t.Fatal(err)
	}
	return dec.Statuses[0].Remaining
}

func authzLease(want, returned, grantedAt int64, user string) *allotv1.LeaseItem {
	return &allotv1.LeaseItem{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", user)}, Want: want, Returned: returned, ReturnedGrantedAtUnixNano: grantedAt}
}

func envoyRefund(domain, user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}, IsNegativeHits: true}}}
}

func envoyOverride(domain, user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}},
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1 << 20, Unit: typev3.RateLimitUnit_SECOND}}}}
}

// exhaust spends user's 10 in domain.
func exhaust(t *testing.T, s *Service, domain, user string) {
	t.Helper()
	var dec allot.Decision
	if err := s.Engine().Check(time.Now(), domain, allot.Descriptor{{Key: "user", Value: user}}, 10, &dec); err != nil || !dec.Allowed {
		t.Fatalf("exhaust: %v %v", err, dec.Allowed)
	}
}

// TestLeaseReturnBoundedByGrants: over TLS, a gateway gives back at most
// what it was granted at the instant it names and has not returned; a
// return beyond it (Lease{returned: 2^40}) refunds nothing, and another
// gateway cannot return the first one's grant.
func TestLeaseReturnBoundedByGrants(t *testing.T) {
	e := startTLSEnforcer(t, authzPolicy)
	gw := allotv1.NewRateLimiterClient(e.dial(t, gatewayURI))
	other := allotv1.NewRateLimiterClient(e.dial(t, otherGwURI))
	ctx := context.Background()

	// Tokens never leased: the key stays exhausted.
	exhaust(t, e.svc, "api", "a")
	if _, err := gw.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(0, 1<<40, time.Now().UnixNano(), "a")}}); err != nil {
		t.Fatalf("a return beyond the grants fails the call: %v", err)
	}
	if got := left(t, e.svc, "api", "a"); got != 0 {
		t.Fatalf("a return of 2^40 tokens never leased refilled the key to %d", got)
	}
	if got := counterValue(e.svc.leases.tokens.WithLabelValues("refused")); got != 1<<40 {
		t.Fatalf("refused tokens %v, want 2^40", got)
	}

	// A grant comes back at most whole, once, and only to its caller.
	resp, err := gw.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(6, 0, 0, "b")}})
	if err != nil || resp.Grants[0].Granted == 0 {
		t.Fatalf("grant: %v %v", resp, err)
	}
	n, at := resp.Grants[0].Granted, resp.Grants[0].GrantedAtUnixNano
	var dec allot.Decision
	if err := e.svc.Engine().Check(time.Now(), "api", allot.Descriptor{{Key: "user", Value: "b"}}, 10-n, &dec); err != nil || !dec.Allowed {
		t.Fatalf("spend the rest: %v", err)
	}
	if _, err := other.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(0, n, at, "b")}}); err != nil {
		t.Fatal(err)
	}
	if got := left(t, e.svc, "api", "b"); got != 0 {
		t.Fatalf("another gateway returned gw1's grant: left %d", got)
	}
	if _, err := gw.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(0, 1<<40, at, "b")}}); err != nil {
		t.Fatal(err)
	}
	if got := left(t, e.svc, "api", "b"); got != n {
		t.Fatalf("returning more than a grant of %d: left %d, want %d", n, got, n)
	}
	if _, err := gw.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(0, n, at, "b")}}); err != nil {
		t.Fatal(err)
	}
	if got := left(t, e.svc, "api", "b"); got != n {
		t.Fatalf("a grant returned twice: left %d, want %d", got, n)
	}
}

// TestEnvoyRefundsNeedTheRole: negative hits and limit overrides are
// refused, charging nothing, to a caller without the refund role, and in
// a domain without allow_refunds; with both they are served.
func TestEnvoyRefundsNeedTheRole(t *testing.T) {
	e := startTLSEnforcer(t, authzPolicy)
	gw := rlsv3.NewRateLimitServiceClient(e.dial(t, gatewayURI))
	envoy := rlsv3.NewRateLimitServiceClient(e.dial(t, envoyURI))
	ctx := context.Background()
	exhaust(t, e.svc, "api", "a")
	exhaust(t, e.svc, "closed", "a")
	for _, c := range []struct {
		what   string
		client rlsv3.RateLimitServiceClient
		req    *rlsv3.RateLimitRequest
	}{
		{"negative hits without the role", gw, envoyRefund("api", "a")},
		{"an override without the role", gw, envoyOverride("api", "a")},
		{"negative hits in a domain without allow_refunds", envoy, envoyRefund("closed", "a")},
		{"an override in a domain without allow_refunds", envoy, envoyOverride("closed", "a")},
	} {
		_, err := c.client.ShouldRateLimit(ctx, c.req)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", c.what, err)
		}
	}
	if a, closed := left(t, e.svc, "api", "a"), left(t, e.svc, "closed", "a"); a != 0 || closed != 0 {
		t.Fatalf("refused refunds changed the keys: api %d, closed %d", a, closed)
	}
	resp, err := envoy.ShouldRateLimit(ctx, envoyRefund("api", "a"))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a refund with the role where the domain allows it: %v %v", resp, err)
	}
	if got := left(t, e.svc, "api", "a"); got != 5 {
		t.Fatalf("after refunding 5: left %d", got)
	}
	resp, err = envoy.ShouldRateLimit(ctx, envoyOverride("api", "a"))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("an override with the role where the domain allows it: %v %v", resp, err)
	}
	if got := counterValue(e.svc.authz.refusals.WithLabelValues("refund", "gateway", "role")); got != 2 {
		t.Errorf("refusals{refund, gateway, role} = %v, want 2", got)
	}
	if got := counterValue(e.svc.authz.refusals.WithLabelValues("refund", "gateway", "domain")); got != 2 {
		t.Errorf("refusals{refund, gateway, domain} = %v, want 2", got)
	}
}

// TestCheckOnlyCertificate: a client's certificate checks, and cannot
// lease, refund, override, read Admin or lend.
func TestCheckOnlyCertificate(t *testing.T) {
	e := startTLSEnforcer(t, authzPolicy)
	cc := e.dial(t, clientURI)
	rl, envoy := allotv1.NewRateLimiterClient(cc), rlsv3.NewRateLimitServiceClient(cc)
	ctx := context.Background()
	if _, err := rl.Check(ctx, &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "c")}}}}); err != nil {
		t.Fatalf("check: %v", err)
	}
	exhaust(t, e.svc, "api", "a")
	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", what, err)
		}
	}
	_, err := rl.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(5, 0, 0, "c")}})
	denied("lease", err)
	_, err = rl.Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(0, 5, time.Now().UnixNano(), "a")}})
	denied("lease return", err)
	_, err = envoy.ShouldRateLimit(ctx, envoyRefund("api", "a"))
	denied("negative hits", err)
	_, err = envoy.ShouldRateLimit(ctx, envoyOverride("api", "a"))
	denied("override", err)
	_, err = allotv1.NewAdminClient(cc).Status(ctx, &allotv1.StatusRequest{})
	denied("admin status", err)
	_, err = allotv1.NewPeerClient(cc).Lend(ctx, &allotv1.LendRequest{Region: "b", Domain: "api", Limit: "per-user", Key: "per-user:user=a", Amount: 5, LoanId: 1})
	denied("lend", err)
	if got := left(t, e.svc, "api", "a"); got != 0 {
		t.Fatalf("a check-only client refilled a key to %d", got)
	}
	if got := left(t, e.svc, "api", "c"); got != 9 { // its Check's hit
		t.Fatalf("a check-only client leased: left %d, want 9", got)
	}
	if got := counterValue(e.svc.authz.refusals.WithLabelValues("gateway", "client", "role")); got != 2 {
		t.Errorf("refusals{gateway, client, role} = %v, want 2", got)
	}
}

// TestAnonymousRoles: callers without a certificate, over TLS and in
// plain text, have exactly the policy's anonymous roles.
func TestAnonymousRoles(t *testing.T) {
	ctx := context.Background()
	check := func(cc *grpc.ClientConn) error {
		_, err := allotv1.NewRateLimiterClient(cc).Check(ctx, &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api", Descriptors: []*allotv1.Descriptor{desc("user", "x")}, Hits: hits(0)}}})
		return err
	}
	lease := func(cc *grpc.ClientConn) error {
		_, err := allotv1.NewRateLimiterClient(cc).Lease(ctx, &allotv1.LeaseRequest{GatewayId: "g", Items: []*allotv1.LeaseItem{authzLease(1, 0, 0, "x")}})
		return err
	}
	refund := func(cc *grpc.ClientConn) error {
		_, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, envoyRefund("api", "x"))
		return err
	}
	view := func(cc *grpc.ClientConn) error {
		_, err := allotv1.NewAdminClient(cc).Status(ctx, &allotv1.StatusRequest{})
		return err
	}
	calls := []struct {
		role tlsx.Roles
		call func(*grpc.ClientConn) error
	}{{tlsx.RoleCheck, check}, {tlsx.RoleGateway, lease}, {tlsx.RoleRefund, refund}, {tlsx.RoleViewer, view}}
	for _, anon := range []tlsx.Roles{0, tlsx.RoleCheck, tlsx.RoleCheck | tlsx.RoleGateway, tlsx.RoleCheck | tlsx.RoleRefund | tlsx.RoleViewer, tlsx.AllRoles} {
		cfg, err := allot.ParseConfig("authz.yaml", []byte(authzConfig))
		if err != nil {
			t.Fatal(err)
		}
		s := New(regional.New(cfg, regional.Options{}), Options{Region: "r", Authorization: &tlsx.Policy{Anonymous: anon}})
		plain := plainServer(t, s)
		for _, c := range calls {
			if err := c.call(plain); (status.Code(err) == codes.PermissionDenied) == anon.Has(c.role) {
				t.Errorf("plain text, anonymous roles %s, a call needing %s: %v", anon, c.role, err)
			}
		}
		// Over TLS without a client certificate: Admin needs one anyway.
		e := startTLSEnforcer(t, &tlsx.Policy{Anonymous: anon})
		secured := e.dial(t, "")
		for _, c := range calls[:3] {
			if err := c.call(secured); (status.Code(err) == codes.PermissionDenied) == anon.Has(c.role) {
				t.Errorf("TLS without a certificate, anonymous roles %s, a call needing %s: %v", anon, c.role, err)
			}
		}
		// HTTP.
		hs := httpServer(t, s)
		res, err := http.Post(hs+"/v1/check", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"user":"x"}],"hits":0}`))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if want := map[bool]int{true: http.StatusOK, false: http.StatusForbidden}[anon.Has(tlsx.RoleCheck)]; res.StatusCode != want {
			t.Errorf("HTTP check, anonymous roles %s: %d, want %d", anon, res.StatusCode, want)
		}
	}
}

func plainServer(t *testing.T, s *Service) *grpc.ClientConn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.RegisterGRPC(gs)
	s.RegisterAdmin(gs, AdminOptions{})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func httpServer(t *testing.T, s *Service) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.HTTPHandler(HTTPOptions{}), ReadHeaderTimeout: time.Second}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	return "http://" + l.Addr().String()
}

// TestEveryMethodHasARole: every method a Service registers is in
// methodRoles (a missing one is refused to every caller).
func TestEveryMethodHasARole(t *testing.T) {
	cfg, err := allot.ParseConfig("authz.yaml", []byte(authzConfig))
	if err != nil {
		t.Fatal(err)
	}
	s := New(regional.New(cfg, regional.Options{}), Options{Region: "r"})
	gs := grpc.NewServer()
	s.RegisterGRPC(gs)
	s.RegisterAdmin(gs, AdminOptions{})
	n := 0
	for svc, info := range gs.GetServiceInfo() {
		for _, m := range info.Methods {
			n++
			if _, ok := methodRoles["/"+svc+"/"+m.Name]; !ok {
				t.Errorf("/%s/%s has no role", svc, m.Name)
			}
		}
	}
	if n != len(methodRoles) {
		t.Errorf("%d methods registered, %d in methodRoles", n, len(methodRoles))
	}
}
