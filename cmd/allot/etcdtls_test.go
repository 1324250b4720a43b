package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// freeAddr is a loopback address free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEtcdClientFollowsARotatedCA: the etcd client of allot regional and
// allot coordinator (--etcd-tls-*: tlsFlags.etcdTLS, etcdClient) verifies
// each new connection against the CA bundle in force when it is made. An
// embedded etcd serves TLS with a certificate of a CA the client's bundle
// does not hold: the client is refused. Once the bundle file is rewritten
// with that CA added (a rotation: the old CA stays), the client's next
// connection verifies and its calls succeed, without a new client; a
// client made with the fixed configuration of the start (clientv3's TLS
// alone, without the links' dial options) still refuses the server, so
// the test tells the two apart. When the CA is taken out of the bundle
// again, the client's next connection (etcd restarted) is refused.
func TestEtcdClientFollowsARotatedCA(t *testing.T) {
	t.Parallel()
	server, other := testpki.New(t), testpki.New(t)
	srvFiles := server.Issue(t, "etcd", testpki.Leaf{IPs: testpki.Loopback})
	// The client's certificate is of the server's CA (etcd requires one),
	// its bundle at first only the other CA.
	cliFiles := server.Issue(t, "enforcer", testpki.Leaf{URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})
	bundle := filepath.Join(t.TempDir(), "etcd-ca.crt")
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	testpki.WriteFile(t, bundle, read(other.CAFile))

	addr, peer, dir := freeAddr(t), "http://"+freeAddr(t), t.TempDir()
	files := etcdstore.EmbeddedTLS{CertFile: srvFiles.Cert, KeyFile: srvFiles.Key, CAFile: server.CAFile}
	e, err := etcdstore.StartEmbeddedTLS(dir, "https://"+addr, peer, files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e != nil {
			e.Close() // the one running at the end
		}
	})

	f := tlsFlags{etcd: tlsx.Flags{Files: tlsx.Files{Cert: cliFiles.Cert, Key: cliFiles.Key, CA: bundle}}}
	cfg, dial, err := f.etcdTLS(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil || len(dial) == 0 {
		t.Fatalf("etcdTLS: %v, %d dial options; want TLS and the links' dial option", cfg, len(dial))
	}
	following, err := etcdClient(addr, cfg, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { following.Close() })
	fixed, err := etcdClient(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fixed.Close() })
	// A call refused at the handshake is retried until its deadline.
	put := func(c *clientv3.Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Put(ctx, "allot-test", "x")
		return err
	}
	if put(following) == nil || put(fixed) == nil {
		t.Fatal("a server of a CA the client's bundle lacks was accepted")
	}

	// The rotation reaches the client's bundle: the old CA and the new.
	testpki.WriteFile(t, bundle, append(read(other.CAFile), read(server.CAFile)...))
	rotated := time.Now()
	waitFor(t, 20*time.Second, "successful call of the client that follows the bundle", func() bool { return put(following) == nil })
	t.Logf("the client trusts the server %v after the rotation", time.Since(rotated).Round(time.Millisecond))
	if err := put(fixed); err == nil {
		t.Fatal("the client with the fixed configuration followed the rotation too: the test proves nothing")
	}

	// The server's CA taken out of the bundle, and etcd restarted (its
	// clients' connections end): the client's new connection is refused.
	testpki.WriteFile(t, bundle, read(other.CAFile))
	time.Sleep(1100 * time.Millisecond) // the Source's interval
	e.Close()
	if e, err = etcdstore.StartEmbeddedTLS(dir, "https://"+addr, peer, files); err != nil {
		e = nil // closed above
		t.Fatal(err)
	}
	if err := put(following); err == nil {
		t.Fatal("a call after the CA left the bundle succeeded")
	}
}
