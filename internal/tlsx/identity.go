package tlsx

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Errors of the identity functions.
var (
	// ErrNoClientCert: PeerCertificate, RequestCertificate and the
	// identity functions, for a caller without a verified certificate
	// (plain text, or TLS without a client certificate).
	ErrNoClientCert = errors.New("tlsx: no verified client certificate")
	// ErrNoIdentity: ParseIdentity and the identity functions, for a
	// certificate without an allot identity (a spiffe:// URI SAN that
	// follows the convention of Identity).
	ErrNoIdentity = errors.New("tlsx: no allot identity in the certificate")
	// ErrIdentity: Identity.SpeaksFor, for an identity that does not
	// name the region or instance a request declares, or names no
	// enforcer.
	ErrIdentity = errors.New("tlsx: the certificate does not name who the request says")
)

// MutualServices are the gRPC services that require a verified client
// certificate whenever a process runs TLS: region ↔ region, region ↔
// coordinator, and operators (RequireClientCert).
var MutualServices = []string{"allot.v1.Peer", "allot.v1.Coordinator", "allot.v1.Admin"}

// RequireClientCert returns gRPC server options that refuse calls to the
// services named (full names such as "allot.v1.Peer"), with
// Unauthenticated, from callers without a verified client certificate.
// The TLS layer of a server that also serves gateways asks for client
// certificates and verifies those given (tls.VerifyClientCertIfGiven);
// this is where they become required. Use it only with TLS: in plain text
// it refuses every call to them.
func RequireClientCert(services ...string) []grpc.ServerOption {
	check := func(ctx context.Context, method string) error {
		svc, _, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
		if !slices.Contains(services, svc) {
			return nil
		}
		if _, err := PeerCertificate(ctx); err != nil {
			return status.Errorf(codes.Unauthenticated, "%s needs a client certificate signed by the fleet's CA (mutual TLS)", svc)
		}
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

// PeerCertificate returns the verified client certificate of a gRPC
// call's caller.
func PeerCertificate(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, ErrNoClientCert
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, ErrNoClientCert
	}
	return info.State.VerifiedChains[0][0], nil
}

// RequestCertificate returns the verified client certificate of an HTTP
// request's caller.
func RequestCertificate(r *http.Request) (*x509.Certificate, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil, ErrNoClientCert
	}
	return r.TLS.VerifiedChains[0][0], nil
}

// PeerIdentity is the identity in a gRPC caller's verified certificate.
func PeerIdentity(ctx context.Context) (Identity, error) {
	c, err := PeerCertificate(ctx)
	if err != nil {
		return Identity{}, err
	}
	return ParseIdentity(c)
}

// RequestIdentity is the identity in an HTTP caller's verified
// certificate.
func RequestIdentity(r *http.Request) (Identity, error) {
	c, err := RequestCertificate(r)
	if err != nil {
		return Identity{}, err
	}
	return ParseIdentity(c)
}

// Caller is the identity of a gRPC call's caller, for the checks of what
// its messages declare. secured is false for a call that did not come over
// TLS (plain text, loopback only): there is no certificate to check
// against, and callers let it through as before. Over TLS, err is
// ErrNoClientCert without a verified client certificate, or wraps
// ErrNoIdentity for a certificate without an allot identity.
func Caller(ctx context.Context) (id Identity, secured bool, err error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, false, nil
	}
	if _, ok := p.AuthInfo.(credentials.TLSInfo); !ok {
		return Identity{}, false, nil
	}
	id, err = PeerIdentity(ctx)
	return id, true, err
}

// Identity is who a certificate names, by allot's convention: a URI SAN
//
//	spiffe://TRUST-DOMAIN/KEY/VALUE[/KEY/VALUE...]
//
// whose path is pairs of a key and a value, keys among region, instance,
// coordinator, operator, gateway and client, each at most once:
//
//	spiffe://allot/region/us-east/instance/i1   an enforcer instance of us-east
//	spiffe://allot/coordinator/c1               a coordinator
//	spiffe://allot/operator/alice               an operator (allotctl)
//	spiffe://allot/region/us-east/gateway/gw1   a gateway (the Go SDK) in us-east
//	spiffe://allot/gateway/edge-7               a gateway of no region
//	spiffe://allot/client/billing               a client that only checks
//
// What a caller may do (its roles, roles.go) is decided from its Identity
// by the server, never from what a message declares.
type Identity struct {
	URI         string // the SAN it was read from
	TrustDomain string // "allot" above
	Region      string
	Instance    string
	Coordinator string
	Operator    string
	Gateway     string
	Client      string
}

// Kind is what the identity names: "instance" (an enforcer instance,
// with its region), "coordinator", "operator", "gateway", "client", or
// "region" (a region alone).
func (id Identity) Kind() string {
	switch {
	case id.Client != "":
		return "client"
	case id.Coordinator != "":
		return "coordinator"
	case id.Operator != "":
		return "operator"
	case id.Gateway != "":
		return "gateway"
	case id.Instance != "":
		return "instance"
	case id.Region != "":
		return "region"
	}
	return ""
}

// Enforcer reports whether id names an enforcer: an instance of a
// region, or a region as a whole. Only an enforcer speaks for a region
// (Peer, Coordinator); a gateway's identity names a region too, but is
// not one.
func (id Identity) Enforcer() bool { k := id.Kind(); return k == "instance" || k == "region" }

// SpeaksFor checks that id may speak for instance of region, as a
// request declares them: id is an enforcer of region, and its instance is
// instance ("" for both: a region's certificate, a request of no
// instance). Its errors wrap ErrIdentity.
func (id Identity) SpeaksFor(region, instance string) error {
	switch {
	case !id.Enforcer():
		return fmt.Errorf("%w: %s is no enforcer's identity (spiffe://DOMAIN/region/R/instance/I)", ErrIdentity, id.URI)
	case id.Region != region:
		return fmt.Errorf("%w: %s names region %q, the request %q", ErrIdentity, id.URI, id.Region, region)
	case id.Instance != instance:
		return fmt.Errorf("%w: %s names instance %q, the request %q", ErrIdentity, id.URI, id.Instance, instance)
	}
	return nil
}

// ParseIdentity reads the allot identity of c: its first spiffe:// URI
// SAN. It fails with ErrNoIdentity when c has none, and names what is
// wrong with one that does not follow the convention.
func ParseIdentity(c *x509.Certificate) (Identity, error) {
	for _, u := range c.URIs {
		if u.Scheme == "spiffe" {
			return ParseIdentityURI(u)
		}
	}
	return Identity{}, ErrNoIdentity
}

// ParseIdentityURI reads an identity from a spiffe:// URI (see Identity).
func ParseIdentityURI(u *url.URL) (Identity, error) {
	id := Identity{URI: u.String(), TrustDomain: u.Host}
	bad := func(why string) (Identity, error) {
		return Identity{}, fmt.Errorf("%w: %s: %s", ErrNoIdentity, u, why)
	}
	if u.Scheme != "spiffe" || u.Host == "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" {
		return bad("want spiffe://TRUST-DOMAIN/KEY/VALUE...")
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts)%2 != 0 || parts[0] == "" {
		return bad("the path must be KEY/VALUE pairs")
	}
	for i := 0; i < len(parts); i += 2 {
		k, v := parts[i], parts[i+1]
		if v == "" {
			return bad("empty value of " + k)
		}
		var f *string
		switch k {
		case "region":
			f = &id.Region
		case "instance":
			f = &id.Instance
		case "coordinator":
			f = &id.Coordinator
		case "operator":
			f = &id.Operator
		case "gateway":
			f = &id.Gateway
		case "client":
			f = &id.Client
		default:
			return bad("unknown key " + k + " (want region, instance, coordinator, operator, gateway or client)")
		}
		if *f != "" {
			return bad(k + " given twice")
		}
		*f = v
	}
	if id.Instance != "" && id.Region == "" {
		return bad("an instance needs its region")
	}
	n := 0
	for _, v := range []string{id.Instance, id.Coordinator, id.Operator, id.Gateway, id.Client} {
		if v != "" {
			n++
		}
	}
	if n > 1 {
		return bad("at most one of instance, coordinator, operator, gateway and client")
	}
	return id, nil
}
