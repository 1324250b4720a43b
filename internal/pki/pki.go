// Package pki makes throwaway certificates: a CA and the leaf
// certificates it signs, as PEM. Keys are ECDSA P-256; every leaf is good
// for both server and client authentication, since allot's processes
// present their certificate on their own links too (docs/security.md).
//
// It is what `allot cluster up` (deploy/local) makes its cluster's CA
// with, and what internal/testpki wraps for tests:
//
//	ca, err := pki.NewCA("allot local cluster CA", time.Now().Add(30*24*time.Hour))
//	cert, key, err := ca.Sign(pki.Leaf{CommonName: "us-east-1", IPs: pki.Loopback,
//		URIs: []string{"spiffe://allot/region/us-east/instance/us-east-1"}})
//	err = pki.WriteFile(path, cert, 0o644)
//
// Not a CA for production fleets: no revocation, no key storage. A CA's
// methods are safe for concurrent use.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"
)

// Loopback are the loopback addresses (127.0.0.1, ::1).
var Loopback = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte // Cert as PEM
	key  crypto.Signer
}

// Leaf describes a leaf certificate.
type Leaf struct {
	CommonName string
	DNS        []string // DNS SANs; "localhost" is always added
	IPs        []net.IP // IP SANs
	URIs       []string // URI SANs, such as spiffe://allot/region/us-east/instance/i1
	// NotBefore and NotAfter default to an hour ago and the CA's NotAfter.
	NotBefore, NotAfter time.Time
}

// serial is a random 128-bit serial number.
func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// NewCA makes a self-signed CA named name, valid from an hour ago until
// notAfter. Its subject carries its serial number, so that two CAs of the
// same name (a rotation) have distinct subjects.
func NewCA(name string, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, SerialNumber: sn.String()},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// KeyPEM is the CA's private key as PEM (PKCS #8), for LoadCA.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// LoadCA reads a CA from PEM: its private key (PKCS #8, SEC 1 EC or
// PKCS #1 RSA) and, among the certificates of certPEM (a bundle), the CA
// certificate of that key. allot dev signs its certificates with one
// (--tls-ca, --tls-ca-key).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	blk, _ := pem.Decode(keyPEM)
	if blk == nil {
		return nil, errors.New("pki: the CA key is not PEM")
	}
	var key any
	var err error
	switch blk.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(blk.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: the CA key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: the CA key (%T) cannot sign", key)
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok {
		return nil, fmt.Errorf("pki: the CA key (%T) is of no known kind", key)
	}
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return nil, errors.New("pki: no CA certificate of the key in the bundle")
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: a CA certificate: %w", err)
		}
		if !pub.Equal(c.PublicKey) {
			continue
		}
		if !c.IsCA || (c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0) {
			return nil, fmt.Errorf("pki: the certificate of the key (%s) is not a CA's", c.Subject)
		}
		return &CA{Cert: c, PEM: pem.EncodeToMemory(b), key: signer}, nil
	}
}

// Sign signs a leaf certificate, for server and client authentication,
// and returns its PEM and its key's PEM (PKCS #8).
func (ca *CA) Sign(l Leaf) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Hour)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
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
			return nil, nil, fmt.Errorf("pki: URI SAN %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// WriteFile writes b to path atomically, with perm: a temporary file
// renamed over it, so that a process reloading path never reads half a
// file.
func WriteFile(path string, b []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return err
	}
	if err := os.Chmod(tmp, perm); err != nil { // an earlier tmp file kept its mode
		return err
	}
	return os.Rename(tmp, path)
}
