package tlsx_test

import (
	"errors"
	"net/url"
	"testing"

	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// TestSpeaksFor: only an enforcer's identity speaks for a region, and
// only for its own region and instance.
func TestSpeaksFor(t *testing.T) {
	for _, c := range []struct {
		uri, region, instance string
		ok                    bool
	}{
		{"spiffe://allot/region/us-east/instance/i1", "us-east", "i1", true},
		{"spiffe://allot/region/us-east/instance/i1", "us-east", "i2", false},
		{"spiffe://allot/region/us-east/instance/i1", "us-east", "", false},
		{"spiffe://allot/region/us-east/instance/i1", "eu-west", "i1", false},
		{"spiffe://allot/region/us-east", "us-east", "", true},
		{"spiffe://allot/region/us-east", "us-east", "i1", false},
		{"spiffe://allot/region/us-east/gateway/gw1", "us-east", "", false},
		{"spiffe://allot/operator/alice", "", "", false},
		{"spiffe://allot/coordinator/c1", "", "", false},
	} {
		u, err := url.Parse(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		id, err := tlsx.ParseIdentityURI(u)
		if err != nil {
			t.Fatal(err)
		}
		err = id.SpeaksFor(c.region, c.instance)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, tlsx.ErrIdentity)) {
			t.Errorf("%s speaks for %q/%q: %v, want ok=%v", c.uri, c.region, c.instance, err, c.ok)
		}
	}
}

// TestSourceIdentity: a Source names the identity of its own
// certificate.
func TestSourceIdentity(t *testing.T) {
	pki := testpki.New(t)
	src := source(t, pki.Issue(t, "i1", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}}))
	id, err := src.Identity()
	if err != nil || id.Region != "us-east" || id.Instance != "i1" {
		t.Fatalf("identity %+v, %v; want us-east/i1", id, err)
	}
	if _, err := source(t, testpki.Files{CA: pki.CAFile}).Identity(); !errors.Is(err, tlsx.ErrNoCert) {
		t.Fatalf("a Source without a certificate: %v, want ErrNoCert", err)
	}
}
