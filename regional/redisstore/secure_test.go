package redisstore_test

import (
	"context"
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
