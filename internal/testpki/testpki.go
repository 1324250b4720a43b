// Package testpki makes throwaway certificates for tests: a CA and leaf
// certificates it signs, written as PEM files in a temporary directory
// removed when the test ends. Keys are ECDSA P-256 (internal/pki makes
// them). Not for production.
//
//	pki := testpki.New(t)
//	srv := pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
//	cli := pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/operator/alice"}})
//	src, _ := tlsx.NewSource(tlsx.Files(srv), tlsx.Options{})
//
// Its methods are not safe for concurrent use.
package testpki

import (
	"crypto/x509"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/pki"
)

// Loopback are the loopback addresses most tests' certificates name.
var Loopback = pki.Loopback

// Files are the paths of a leaf's certificate and key, and of its CA's
// certificate; tlsx.Files(f) converts them.
type Files struct {
	Cert, Key, CA string
}

// Leaf describes a leaf certificate. Every leaf is good for both server
// and client authentication.
type Leaf struct {
	CommonName string   // default: the name given to Issue
	DNS        []string // DNS SANs; "localhost" is always added
	IPs        []net.IP // IP SANs
	URIs       []string // URI SANs, such as spiffe://allot/region/us-east/instance/i1
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// PKI is a CA and the directory its files are written in.
type PKI struct {
	Dir    string // the temporary directory
	CAFile string // the CA's certificate (PEM)
	CA     *x509.Certificate
	ca     *pki.CA
	bundle []byte // every CA's certificate so far
}

// New makes a CA (named "allot test CA") and writes its certificate,
// CAFile, in a new temporary directory.
func New(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir()}
	p.CAFile = filepath.Join(p.Dir, "ca.crt")
	p.RotateCA(t)
	return p
}

// RotateCA makes a new CA, which signs the leaves issued from then on,
// and adds its certificate to CAFile (atomically: a rename), as a CA
// rotation does: the bundle holds the old CAs and the new one.
func (p *PKI) RotateCA(t testing.TB) {
	t.Helper()
	ca, err := pki.NewCA("allot test CA", time.Now().Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p.ca, p.CA = ca, ca.Cert
	p.bundle = append(p.bundle, ca.PEM...)
	WriteFile(t, p.CAFile, p.bundle)
}

// Issue signs a leaf certificate and writes NAME.crt and NAME.key in
// Dir (each atomically, certificate first), replacing an earlier NAME's.
func (p *PKI) Issue(t testing.TB, name string, l Leaf) Files {
	t.Helper()
	cert, key := p.Sign(t, name, l)
	f := Files{Cert: filepath.Join(p.Dir, name+".crt"), Key: filepath.Join(p.Dir, name+".key"), CA: p.CAFile}
	WriteFile(t, f.Cert, cert)
	WriteFile(t, f.Key, key)
	return f
}

// Sign signs a leaf certificate and returns its PEM and its key's PEM.
func (p *PKI) Sign(t testing.TB, name string, l Leaf) (certPEM, keyPEM []byte) {
	t.Helper()
	if l.CommonName == "" {
		l.CommonName = name
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = time.Now().Add(24 * time.Hour)
	}
	cert, key, err := p.ca.Sign(pki.Leaf{CommonName: l.CommonName, DNS: l.DNS, IPs: l.IPs, URIs: l.URIs, NotBefore: l.NotBefore, NotAfter: l.NotAfter})
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// WriteFile writes b to path atomically: a temporary file renamed over it.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := pki.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
