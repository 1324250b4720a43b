package tlsx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Roles is a set of what a caller may do at an enforcer (docs/security.md,
// "Roles"). The zero value is no role.
type Roles uint8

// The roles. The regional server (regional/server/authz.go) says which
// role each method needs.
const (
	// RoleCheck: Check, Envoy's ShouldRateLimit, Reserve, and Settle and
	// Release of its own reservations.
	RoleCheck Roles = 1 << iota
	// RoleGateway: Lease and Envoy's rate limit quota service (RLQS):
	// decide in its own process on a part of the allowance, and give
	// back what it was granted and did not spend.
	RoleGateway
	// RoleRefund: Envoy's negative hits (is_negative_hits) and
	// per-request limit overrides, in domains that allow them
	// (allow_refunds).
	RoleRefund
	// RoleViewer: Admin reads (a region's Usage and Status, the
	// coordinator's GetConfig, History, ListOverrides, ListPlans, Usage
	// and Status).
	RoleViewer
	// RoleOperator: Admin writes. An operator may read too: a Policy
	// gives every caller with operator viewer as well.
	RoleOperator

	// AllRoles is every role.
	AllRoles = RoleCheck | RoleGateway | RoleRefund | RoleViewer | RoleOperator
)

var roleNames = []struct {
	r    Roles
	name string
}{
	{RoleCheck, "check"}, {RoleGateway, "gateway"}, {RoleRefund, "refund"}, {RoleViewer, "viewer"}, {RoleOperator, "operator"},
}

// ErrRoles: ParseRoles and ParseGrant, for a name that is no role or a
// grant that is not URI=ROLE[,ROLE...].
var ErrRoles = errors.New("tlsx: bad roles")

func roleByName(name string) (Roles, bool) {
	for _, n := range roleNames {
		if n.name == name {
			return n.r, true
		}
	}
	return 0, false
}

// Has reports whether rs holds every role of want.
func (rs Roles) Has(want Roles) bool { return rs&want == want }

// String names the roles, comma-separated in the order check, gateway,
// refund, viewer, operator; "none" for no role.
func (rs Roles) String() string {
	var names []string
	for _, n := range roleNames {
		if rs.Has(n.r) {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ParseRoles reads a comma-separated list of role names (check, gateway,
// refund, viewer, operator); "" and "none" are no role.
func ParseRoles(s string) (Roles, error) {
	var rs Roles
	if s = strings.TrimSpace(s); s == "" || s == "none" {
		return 0, nil
	}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		r, ok := roleByName(name)
		if !ok {
			return 0, fmt.Errorf("%w: unknown role %q, want check, gateway, refund, viewer, operator or none", ErrRoles, name)
		}
		rs |= r
	}
	return rs, nil
}

// Roles are the roles an identity has by its kind, before any Grant:
//
//	gateway (…/gateway/G, …/region/R/gateway/G)   check, gateway
//	client (…/client/NAME)                        check
//	operator (…/operator/NAME)                    operator, viewer, check (an operator tries
//	                                              a limit as a client would: allot cluster up's curl)
//	coordinator (…/coordinator/C)                 viewer (its fan-out of Usage and Status)
//	enforcer (…/region/R[/instance/I])            none here: its Peer and Coordinator
//	                                              calls are checked by SpeaksFor
//
// No kind has refund: a Grant gives it.
func (id Identity) Roles() Roles {
	switch id.Kind() {
	case "gateway":
		return RoleCheck | RoleGateway
	case "client":
		return RoleCheck
	case "operator":
		return RoleOperator | RoleViewer | RoleCheck
	case "coordinator":
		return RoleViewer
	}
	return 0
}

// Grant adds roles to the identities it names: URI is an identity's URI,
// or a prefix of identities ending in "/*"
// (spiffe://allot/region/us-east/gateway/* is every gateway of us-east).
type Grant struct {
	URI   string
	Roles Roles
}

// ParseGrant reads URI=ROLE[,ROLE...] (--grant-roles).
func ParseGrant(s string) (Grant, error) {
	uri, roles, ok := strings.Cut(s, "=")
	if !ok || !strings.HasPrefix(uri, "spiffe://") {
		return Grant{}, fmt.Errorf("%w: %q, want spiffe://…=ROLE[,ROLE...]", ErrRoles, s)
	}
	rs, err := ParseRoles(roles)
	if err != nil {
		return Grant{}, err
	}
	return Grant{URI: uri, Roles: rs}, nil
}

func (g Grant) names(id Identity) bool {
	if prefix, ok := strings.CutSuffix(g.URI, "*"); ok && strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(id.URI, prefix)
	}
	return id.URI == g.URI
}

// Policy decides a caller's roles. The zero value gives a caller without
// an identity no role and one with an identity the roles of its kind
// (Identity.Roles). Not written after use; safe for concurrent use.
type Policy struct {
	// Anonymous are the roles of a caller without an allot identity:
	// plain text (loopback only), TLS without a client certificate, or a
	// verified certificate that names no identity by the convention.
	Anonymous Roles
	// Grants add roles to the identities they name.
	Grants []Grant
}

// CallerRoles is who a caller is and what it may do.
type CallerRoles struct {
	// Identity is the caller's; the zero Identity for an anonymous caller.
	Identity Identity
	Roles    Roles
}

// Anonymous reports whether the caller has no identity.
func (c CallerRoles) Anonymous() bool { return c.Identity.URI == "" }

// Kind is a bounded label for the caller: its identity's Kind, or
// "anonymous".
func (c CallerRoles) Kind() string {
	if c.Anonymous() {
		return "anonymous"
	}
	return c.Identity.Kind()
}

// Of returns the roles of a caller with identity id (the zero Identity:
// anonymous). A caller with operator has viewer too: who may change the
// fleet may read it.
func (p *Policy) Of(id Identity) CallerRoles {
	if id.URI == "" {
		return CallerRoles{Roles: withImplied(p.Anonymous)}
	}
	rs := id.Roles()
	for _, g := range p.Grants {
		if g.names(id) {
			rs |= g.Roles
		}
	}
	return CallerRoles{Identity: id, Roles: withImplied(rs)}
}

// withImplied adds the roles rs implies: viewer to operator.
func withImplied(rs Roles) Roles {
	if rs.Has(RoleOperator) {
		rs |= RoleViewer
	}
	return rs
}

// Peer returns the roles of a gRPC call's caller: from the identity of
// its verified certificate, else the anonymous roles.
func (p *Policy) Peer(ctx context.Context) CallerRoles {
	id, err := PeerIdentity(ctx)
	if err != nil {
		id = Identity{}
	}
	return p.Of(id)
}

// Request returns the roles of an HTTP request's caller, as Peer.
func (p *Policy) Request(r *http.Request) CallerRoles {
	id, err := RequestIdentity(r)
	if err != nil {
		id = Identity{}
	}
	return p.Of(id)
}
