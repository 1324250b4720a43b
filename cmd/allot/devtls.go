package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/allot-dev/allot/internal/pki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// devTLSFlags are allot dev's and allot demo's TLS flags. They serve TLS
// with certificates they issue themselves, one per region, coordinator
// and client, so that a region's certificate speaks for that region
// only (docs/security.md, "Identities"): one certificate for every region
// would let any of them speak as another.
type devTLSFlags struct {
	on        bool   // --tls: a throwaway CA
	dir       string // --tls-dir: where the CA and the certificates are written
	ca, caKey string // --tls-ca, --tls-ca-key: the CA that signs them instead
	insecure  bool   // --insecure: plain text, the default anyway
}

func (f *devTLSFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "tls", false, "mutual TLS on every link, with a certificate per region, the coordinator, an operator (allotctl) and a gateway (the Go SDK), issued by a throwaway CA in --tls-dir; the banner says where")
	fs.StringVar(&f.dir, "tls-dir", "", "with --tls: the folder the CA's and the certificates' files are written in, replaced at every start (default: a temporary folder removed at exit)")
	fs.StringVar(&f.ca, "tls-ca", "", "with --tls-ca-key (implies --tls): the CA certificate (PEM; a bundle may hold others) that signs the certificates instead of a throwaway one, and that every link trusts")
	fs.StringVar(&f.caKey, "tls-ca-key", "", "the private key (PEM) of --tls-ca")
	fs.BoolVar(&f.insecure, "insecure", false, "plain text on loopback only: the default without --tls")
}

// enabled reports whether TLS was asked for.
func (f *devTLSFlags) enabled() bool { return f.on || f.ca != "" || f.caKey != "" }

// devCAValidity is how long allot dev's throwaway CA (and so its
// certificates) is valid.
const devCAValidity = 30 * 24 * time.Hour

// The identities allot dev issues certificates for, by the convention of
// docs/security.md.
const (
	devCoordinatorURI = "spiffe://allot/coordinator/dev"
	devOperatorURI    = "spiffe://allot/operator/dev"
	devGatewayURI     = "spiffe://allot/gateway/dev"
	// devDemoURI is the demo's traffic and dashboard: it checks and
	// reserves (a client's check) and reads the regions' Status and
	// Usage (viewer, granted).
	devDemoURI = "spiffe://allot/client/demo"
)

// devInstance is the instance id of region's enforcer in allot dev, the
// one its certificate names.
func devInstance(region string) string { return region + "-1" }

func devRegionURI(region string) string {
	return "spiffe://allot/region/" + region + "/instance/" + devInstance(region)
}

// devTLS is what allot dev issued: the CA bundle and a certificate per
// holder, loaded.
type devTLS struct {
	dir       string
	ca        string // the CA bundle every Source trusts
	throwaway bool   // the CA was made at this start
	files     map[string]tlsx.Files
	sources   map[string]*tlsx.Source
	cleanup   func() // removes a temporary dir
}

// The holders of devTLS's certificates, besides "region/NAME".
const (
	holderCoordinator = "coordinator"
	holderOperator    = "operator"
	holderGateway     = "gateway"
	holderDemo        = "demo"
)

// plainName is what a region's name must be to name it in a URI SAN and
// a file name.
var plainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// issueDevTLS makes the CA (or loads --tls-ca) and issues a certificate
// for the coordinator, each region's enforcer, an operator and a gateway,
// and for the demo's client when demo is set; each names its holder and
// loopback (127.0.0.1, ::1, localhost).
func issueDevTLS(f *devTLSFlags, regions []string, demo bool, log *slog.Logger) (_ *devTLS, err error) {
	switch {
	case (f.ca == "") != (f.caKey == ""):
		return nil, errors.New("--tls-ca and --tls-ca-key go together: allot dev signs a certificate per region with that CA")
	case f.insecure:
		return nil, errors.New("--insecure and --tls flags are exclusive")
	}
	for _, r := range regions {
		if !plainName.MatchString(r) {
			return nil, fmt.Errorf("--regions: %q cannot name a certificate (letters, digits, '.', '_' and '-')", r)
		}
	}
	t := &devTLS{dir: f.dir, files: map[string]tlsx.Files{}, sources: map[string]*tlsx.Source{}, cleanup: func() {}}
	if t.dir == "" {
		if t.dir, err = os.MkdirTemp("", "allot-dev-tls-"); err != nil {
			return nil, err
		}
		dir := t.dir
		t.cleanup = func() { os.RemoveAll(dir) }
	} else if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return nil, fmt.Errorf("--tls-dir: %w", err)
	}
	defer func() {
		if err != nil {
			t.cleanup()
		}
	}()
	var ca *pki.CA
	if f.ca != "" {
		certPEM, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		keyPEM, err := os.ReadFile(f.caKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca-key: %w", err)
		}
		if ca, err = pki.LoadCA(certPEM, keyPEM); err != nil {
			return nil, fmt.Errorf("--tls-ca, --tls-ca-key: %w", err)
		}
		t.ca = f.ca
	} else {
		if ca, err = pki.NewCA("allot dev CA (throwaway)", time.Now().Add(devCAValidity)); err != nil {
			return nil, err
		}
		t.ca, t.throwaway = filepath.Join(t.dir, "ca.crt"), true
		if err := pki.WriteFile(t.ca, ca.PEM, 0o644); err != nil {
			return nil, err
		}
	}
	holders := map[string]string{holderCoordinator: devCoordinatorURI, holderOperator: devOperatorURI, holderGateway: devGatewayURI}
	if demo {
		holders[holderDemo] = devDemoURI
	}
	for _, r := range regions {
		holders["region/"+r] = devRegionURI(r)
	}
	for holder, uri := range holders {
		cert, key, err := ca.Sign(pki.Leaf{CommonName: uri, IPs: pki.Loopback, URIs: []string{uri}})
		if err != nil {
			return nil, fmt.Errorf("certificate of %s: %w", uri, err)
		}
		name := filepath.Join(t.dir, filepath.Base(holder)) // region/us-east → us-east
		if holder != filepath.Base(holder) {
			name = filepath.Join(t.dir, "region-"+filepath.Base(holder))
		}
		files := tlsx.Files{Cert: name + ".crt", Key: name + ".key", CA: t.ca}
		if err := pki.WriteFile(files.Key, key, 0o600); err != nil {
			return nil, err
		}
		if err := pki.WriteFile(files.Cert, cert, 0o644); err != nil {
			return nil, err
		}
		src, err := tlsx.NewSource(files, tlsx.Options{Logger: log})
		if err != nil {
			return nil, err
		}
		t.files[holder], t.sources[holder] = files, src
	}
	return t, nil
}

// security is the TLS of holder's listeners and links.
func (t *devTLS) security(holder string) security {
	return security{src: t.sources[holder]}
}
