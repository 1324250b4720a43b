package main

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// TestCertInstance: with TLS, allot regional's instance id is the one its
// certificate names (the coordinator and the peers refuse a hello naming
// another); --instance, when given, must be it; a certificate of another
// region or of no enforcer is refused at start. In plain text the id is
// --instance as given (empty: made up).
func TestCertInstance(t *testing.T) {
	pki := testpki.New(t)
	src := func(name, uri string) *tlsx.Source {
		s, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, name, testpki.Leaf{URIs: []string{uri}})), tlsx.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	i1 := src("i1", "spiffe://allot/region/us-east/instance/i1")
	for _, c := range []struct {
		src      *tlsx.Source
		region   string
		instance string
		want     string // the id, or a part of the error
		ok       bool
	}{
		{i1, "us-east", "", "i1", true},
		{i1, "us-east", "i1", "i1", true},
		{i1, "us-east", "i2", "--instance i2, but the TLS certificate names instance i1", false},
		{i1, "eu-west", "", "is not an enforcer instance of eu-west", false},
		{src("region", "spiffe://allot/region/us-east"), "us-east", "", "is not an enforcer instance of us-east", false},
		{src("gw", "spiffe://allot/region/us-east/gateway/gw1"), "us-east", "", "is not an enforcer instance", false},
		{src("none", "https://example.com/x"), "us-east", "", "names no enforcer", false},
		{nil, "us-east", "", "", true},
		{nil, "us-east", "anything", "anything", true},
	} {
		got, err := certInstance(c.src, c.region, c.instance)
		switch {
		case c.ok && (err != nil || got != c.want):
			t.Errorf("%s %q: %q, %v; want %q", c.region, c.instance, got, err, c.want)
		case !c.ok && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %q: %q, %v; want an error with %q", c.region, c.instance, got, err, c.want)
		}
	}
}
