package pki_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/pki"
)

// A leaf verifies against its CA for server and client authentication,
// holds the names and URI asked for, and its key pairs with it; two CAs of
// one name have distinct subjects; WriteFile leaves the mode asked for.
func TestCASignsLeaves(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Sign(pki.Leaf{CommonName: "us-east-1", IPs: pki.Loopback, URIs: []string{"spiffe://allot/region/us-east/instance/us-east-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://allot/region/us-east/instance/us-east-1" || leaf.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("leaf: URIs %v, not after %v (CA %v)", leaf.URIs, leaf.NotAfter, ca.Cert.NotAfter)
	}
	other, err := pki.NewCA("test CA", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if other.Cert.Subject.String() == ca.Cert.Subject.String() {
		t.Error("two CAs of one name share a subject")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: func() *x509.CertPool { p := x509.NewCertPool(); p.AppendCertsFromPEM(other.PEM); return p }()}); err == nil {
		t.Error("a leaf verified against another CA")
	}
	path := filepath.Join(t.TempDir(), "k.key")
	if err := os.WriteFile(path+".tmp", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteFile(path, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("WriteFile: %v, %v", st.Mode(), err)
	}
}

// LoadCA reads back a CA from its certificate (in a bundle with another)
// and key: the leaves it signs verify against the original; a key of no
// certificate of the bundle, or a leaf's, is refused.
func TestLoadCA(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other CA", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := pki.LoadCA(append(append([]byte{}, other.PEM...), ca.PEM...), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Fatalf("loaded %s, want %s", loaded.Cert.Subject, ca.Cert.Subject)
	}
	certPEM, _, err := loaded.Sign(pki.Leaf{CommonName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("a leaf of the loaded CA: %v", err)
	}
	if _, err := pki.LoadCA(other.PEM, keyPEM); err == nil {
		t.Error("a key of no certificate of the bundle was taken")
	}
	leafCert, leafKey, err := ca.Sign(pki.Leaf{CommonName: "leaf"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadCA(leafCert, leafKey); err == nil {
		t.Error("a leaf's certificate and key were taken as a CA")
	}
}
