package tlsx_test

import (
	"errors"
	"net/url"
	"testing"

	"github.com/allot-dev/allot/internal/tlsx"
)

// TestRoles: the roles of each kind of identity, what grants add, and
// the anonymous roles.
func TestRoles(t *testing.T) {
	p := &tlsx.Policy{Anonymous: tlsx.RoleCheck, Grants: []tlsx.Grant{
		{URI: "spiffe://allot/region/us-east/gateway/envoy", Roles: tlsx.RoleRefund},
		{URI: "spiffe://allot/client/*", Roles: tlsx.RoleViewer},
		{URI: "spiffe://allot/gateway/deployer", Roles: tlsx.RoleOperator},
	}}
	for _, c := range []struct{ uri, want string }{
		{"", "check"},
		{"spiffe://allot/region/us-east/gateway/gw1", "check,gateway"},
		{"spiffe://allot/gateway/edge-7", "check,gateway"},
		{"spiffe://allot/gateway/deployer", "check,gateway,viewer,operator"}, // operator implies viewer
		{"spiffe://allot/region/us-east/gateway/envoy", "check,gateway,refund"},
		{"spiffe://allot/client/app", "check,viewer"},
		{"spiffe://allot/operator/alice", "check,viewer,operator"},
		{"spiffe://allot/coordinator/c1", "viewer"},
		{"spiffe://allot/region/us-east/instance/i1", "none"},
		{"spiffe://allot/region/us-east", "none"},
	} {
		var id tlsx.Identity
		if c.uri != "" {
			u, err := url.Parse(c.uri)
			if err != nil {
				t.Fatal(err)
			}
			if id, err = tlsx.ParseIdentityURI(u); err != nil {
				t.Fatal(err)
			}
		}
		if got := p.Of(id).Roles.String(); got != c.want {
			t.Errorf("%q: %s, want %s", c.uri, got, c.want)
		}
	}
	if got := (&tlsx.Policy{Anonymous: tlsx.RoleOperator}).Of(tlsx.Identity{}).Roles.String(); got != "viewer,operator" {
		t.Errorf("anonymous operator: %s, want viewer,operator", got)
	}
	if _, err := tlsx.ParseIdentityURI(&url.URL{Scheme: "spiffe", Host: "allot", Path: "/client/a/gateway/b"}); !errors.Is(err, tlsx.ErrNoIdentity) {
		t.Errorf("a client and a gateway at once: %v", err)
	}
}

func TestParseRolesAndGrants(t *testing.T) {
	for in, want := range map[string]string{"": "none", "none": "none", "check": "check", " viewer , check ": "check,viewer",
		"check,gateway,refund,viewer,operator": "check,gateway,refund,viewer,operator"} {
		rs, err := tlsx.ParseRoles(in)
		if err != nil || rs.String() != want {
			t.Errorf("ParseRoles(%q) = %s, %v; want %s", in, rs, err, want)
		}
	}
	for _, bad := range []string{"admin", "check,", "check;viewer"} {
		if _, err := tlsx.ParseRoles(bad); !errors.Is(err, tlsx.ErrRoles) {
			t.Errorf("ParseRoles(%q): %v, want ErrRoles", bad, err)
		}
	}
	g, err := tlsx.ParseGrant("spiffe://allot/region/r/gateway/*=refund,check")
	if err != nil || g.URI != "spiffe://allot/region/r/gateway/*" || g.Roles != tlsx.RoleCheck|tlsx.RoleRefund {
		t.Errorf("ParseGrant: %+v, %v", g, err)
	}
	for _, bad := range []string{"refund", "https://x=refund", "spiffe://allot/client/a=root"} {
		if _, err := tlsx.ParseGrant(bad); !errors.Is(err, tlsx.ErrRoles) {
			t.Errorf("ParseGrant(%q): %v, want ErrRoles", bad, err)
		}
	}
}
