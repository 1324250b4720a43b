// Package testpki makes throwaway certificates for tests: a CA and leaf
// certificates it signs, written as PEM files in a temporary directory
// removed when the test ends. Keys are ECDSA P-256. Not for production.
//
//	pki := testpki.New(t)
//	srv := pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})
//	cli := pki.Issue(t, "client", testpki.Leaf{URIs: []string{"spiffe://allot/operator/alice"}})
//	src, _ := tlsx.NewSource(tlsx.Files(srv), tlsx.Options{})
//
// Its methods are not safe for concurrent use.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Loopback are the loopback addresses most tests' certificates name.
var Loopback = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}

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
	key    *ecdsa.PrivateKey
	bundle []byte // every CA's certificate so far
	serial int64
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(p.serial),
		Subject:               pkix.Name{CommonName: "allot test CA", SerialNumber: big.NewInt(p.serial).String()},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if p.CA, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.key = key
	p.bundle = append(p.bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	if l.CommonName == "" {
		l.CommonName = name
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: l.CommonName},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     append([]string{"localhost"}, l.DNS...),
		IPAddresses:  l.IPs,
	}
	for _, s := range l.URIs {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// WriteFile writes b to path atomically: a temporary file renamed over it.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
