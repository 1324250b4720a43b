package redisstore_test

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional/redisstore"
	"github.com/allot-dev/allot/regional/storetest"
)

// TestStoreContractTLSAndACL runs the Store contract against a real
// redis-server that serves TLS only, requires client certificates and
// knows one ACL user (the default user off); a store without the right
// certificate or password is refused.
func TestStoreContractTLSAndACL(t *testing.T) {
	pki := testpki.New(t)
	srvFiles := pki.Issue(t, "redis", testpki.Leaf{IPs: testpki.Loopback})
	cli, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "enforcer", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartSecure(t, redistest.Secure{CertFile: srvFiles.Cert, KeyFile: srvFiles.Key, CAFile: pki.CAFile,
		Client: cli.ClientConfig(""), Username: "allot", Password: "s3cret pass"})
	opts := redisstore.Options{Addrs: []string{srv.Addr}, TLS: cli.ClientConfig(""), Username: "allot", Password: "s3cret pass"}
	storetest.Run(t, newStore(t, opts))

	refused := func(name string, o redisstore.Options, want string) {
		t.Helper()
		s := newStore(t, o)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := s.Ping(ctx)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), want) {
			t.Errorf("%s: Ping: %v, want an error with %q", name, err, want)
		}
	}
	wrong := opts
	wrong.Password = "guess"
	refused("wrong password", wrong, "wrongpass")
	noUser := opts
	noUser.Username, noUser.Password = "", ""
	refused("no AUTH (the default user is off)", noUser, "noauth")
	plain := opts
	plain.TLS = nil
	refused("plain text to the TLS port", plain, "")
	anonymous, err := tlsx.NewSource(tlsx.Files{CA: pki.CAFile}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	noCert := opts
	noCert.TLS = anonymous.ClientConfig("")
	refused("TLS without a client certificate", noCert, "")
}

// TestTLSForFollowsARotatedCA: a store given TLSFor verifies each new
// connection against the CA bundle in force when it dials, so a CA that
// reaches the client's bundle after the store was made is trusted from
// then on (with TLS, the bundle of the store's creation stays).
func TestTLSForFollowsARotatedCA(t *testing.T) {
	pki, other := testpki.New(t), testpki.New(t)
	srvFiles := pki.Issue(t, "redis", testpki.Leaf{IPs: testpki.Loopback})
	files := pki.Issue(t, "enforcer", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})
	serverCli, err := tlsx.NewSource(tlsx.Files(files), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartSecure(t, redistest.Secure{CertFile: srvFiles.Cert, KeyFile: srvFiles.Key, CAFile: pki.CAFile, Client: serverCli.ClientConfig("")})
	// The client trusts another CA at first: the server's is not in its bundle.
	caFile := filepath.Join(t.TempDir(), "bundle.crt")
	copyFile := func(from string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(caFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(other.CAFile)
	src, err := tlsx.NewSource(tlsx.Files{Cert: files.Cert, Key: files.Key, CA: caFile}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	static := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, TLS: src.ClientConfig("")})
	dynamic := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, TLSFor: func(string) *tls.Config { return src.ClientConfig("") }})
	ping := func(s *redisstore.Store) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return s.Ping(ctx)
	}
	if ping(dynamic) == nil || ping(static) == nil {
		t.Fatal("a server of a CA the client does not trust was accepted")
	}
	copyFile(pki.CAFile) // the rotation reaches the client's bundle
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the store with TLSFor trusts the new bundle", func() bool { return ping(dynamic) == nil })
	if err := ping(static); err == nil {
		t.Fatal("the store with a fixed TLS configuration followed the rotation too: the test proves nothing")
	}
}
