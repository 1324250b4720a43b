package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/internal/testdep"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestFleetOverTLS runs a fleet of real processes with TLS everywhere:
// allot etcd (client certificates required), a coordinator and two
// regions with --tls-* and --etcd-tls-*. The regions get their grants
// over mutual TLS (Coordinator), answer checks over HTTPS, and the
// coordinator's Admin API answers an operator's certificate, fanning out
// to the regions' Admin over mutual TLS; a caller without a client
// certificate is refused Admin but may check.
func TestFleetOverTLS(t *testing.T) {
	testdep.Long(t, "builds and runs four processes")
	bin := buildAllot(t)
	dir := t.TempDir()
	pki := testpki.New(t)
	issue := func(name, uri string) testpki.Files {
		return pki.Issue(t, name, testpki.Leaf{IPs: testpki.Loopback, URIs: []string{uri}})
	}
	tlsArgs := func(prefix string, f testpki.Files) []string {
		return []string{"--" + prefix + "tls-cert", f.Cert, "--" + prefix + "tls-key", f.Key, "--" + prefix + "tls-ca", f.CA}
	}
	etcdFiles := pki.Issue(t, "etcd", testpki.Leaf{IPs: testpki.Loopback}) // etcd is no allot identity
	coordFiles := issue("coordinator", "spiffe://allot/coordinator/c1")
	operator := issue("operator", "spiffe://allot/operator/alice")

	_, etcdAddr := startProcess(t, bin, regexp.MustCompile(`clients on https://(\S+)`), append([]string{
		"etcd", "--data-dir", filepath.Join(dir, "etcd"), "--client-addr", loopbackAddr(t), "--peer-addr", loopbackAddr(t)},
		tlsArgs("", etcdFiles)...)...)

	// The fleet's configuration, stored as allotctl limits apply would.
	opSrc, err := tlsx.NewSource(tlsx.Files(operator), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := etcdClient(etcdAddr, opSrc.ClientConfig(""))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nregions: [us-east, eu-west]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h}\n"+
		"  - {name: per-org, match: {org: \"*\"}, rate: 100/1h, mode: shared, sync_interval: 100ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := seedConfig(ctx, etcdstore.New(cli, ""), cfg); err != nil {
		t.Fatal(err)
	}

	_, coord := startProcess(t, bin, regexp.MustCompile(`serving gRPC (\S+)`), append(append([]string{
		"coordinator", "--etcd", etcdAddr, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--rebalance-period", "500ms"},
		tlsArgs("", coordFiles)...), tlsArgs("etcd-", coordFiles)...)...)
	regions := []string{"us-east", "eu-west"}
	grpcAddrs := []string{loopbackAddr(t), loopbackAddr(t)}
	var addrs []string
	for i, region := range regions {
		f := issue(region, "spiffe://allot/region/"+region+"/instance/i1")
		other := 1 - i
		_, addr := startProcess(t, bin, regexp.MustCompile(`HTTP\s+https://(\S+)`), append(append([]string{
			"regional", "--region", region, "--instance", "i1", "--grpc-addr", grpcAddrs[i], "--http-addr", "127.0.0.1:0",
			"--peers", regions[other] + "=" + grpcAddrs[other],
			"--coordinator", coord, "--etcd", etcdAddr, "--report-interval", "200ms"},
			tlsArgs("", f)...), tlsArgs("etcd-", f)...)...)
		addrs = append(addrs, addr)
	}

	// HTTPS with the CA only (no client certificate): checks are served.
	anon, err := tlsx.NewSource(tlsx.Files{CA: pki.CAFile}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hc, _ := anon.HTTPClient("")
	for _, addr := range addrs {
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Get("https://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break // granted over mutual TLS
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 30s: %v", addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		resp, err := hc.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"user":"1"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("check over HTTPS at %s: %d", addr, resp.StatusCode)
		}
		// A TLS server answers plain HTTP with a 400, not the page.
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("plain HTTP answered 200 at %s", addr)
			}
		}
	}

	adminStatus := func(src *tlsx.Source) (*allotv1.StatusResponse, error) {
		cc, err := grpc.NewClient(coord, src.DialOption(""))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return allotv1.NewAdminClient(cc).Status(ctx, &allotv1.StatusRequest{})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := adminStatus(opSrc)
		if err != nil {
			t.Fatalf("Admin Status with an operator's certificate: %v", err)
		}
		answered, synced := 0, 0
		for _, r := range st.GetRegions() {
			if r.GetError() == "" {
				answered++
			}
			for _, p := range r.GetPeers() {
				if p.GetLag() != nil {
					synced++
				}
			}
		}
		// The coordinator reached both regions' Admin over mutual TLS, and
		// each region heard its peer (Peer over mutual TLS).
		if answered == 2 && synced == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("regions in the status: %v", st.GetRegions())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A region's gRPC server serves checks to a caller without a client
	// certificate, and refuses it Admin (and Peer, Coordinator).
	for _, src := range []*tlsx.Source{anon, opSrc} {
		cc, err := grpc.NewClient(grpcAddrs[0], src.DialOption(""))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, cerr := allotv1.NewRateLimiterClient(cc).Check(ctx, &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: "api",
			Descriptors: []*allotv1.Descriptor{{Entries: []*allotv1.Entry{{Key: "user", Value: "2"}}}}}}})
		_, aerr := allotv1.NewAdminClient(cc).Usage(ctx, &allotv1.UsageRequest{Domain: "api", Descriptor_: []*allotv1.Entry{{Key: "user", Value: "1"}}})
		cancel()
		cc.Close()
		if cerr != nil {
			t.Errorf("Check over TLS (client certificate: %v): %v", src == opSrc, cerr)
		}
		if got := grpcstatus.Code(aerr); (src == anon) != (got == codes.Unauthenticated) {
			t.Errorf("region Admin Usage (client certificate: %v): %v", src == opSrc, aerr)
		}
	}

	// The coordinator requires client certificates in the handshake.
	if _, err := adminStatus(anon); err == nil {
		t.Fatal("Admin Status without a client certificate: served")
	}

	// Rotate us-east's certificate while HTTPS checks (a new handshake
	// each) run against it: none fails, and new handshakes get the new
	// certificate without a restart.
	hc.Transport.(*http.Transport).DisableKeepAlives = true
	served := func() (string, error) {
		resp, err := hc.Post("https://"+addrs[0]+"/v1/check", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"user":"3"}],"hits":0}`))
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
	}
	before, err := served()
	if err != nil {
		t.Fatal(err)
	}
	rotated := issue("us-east", "spiffe://allot/region/us-east/instance/i1")
	next, err := tlsx.NewSource(tlsx.Files(rotated), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := next.Certificate().SerialNumber.String()
	calls := 0
	for deadline := time.Now().Add(20 * time.Second); ; calls++ {
		got, err := served()
		if err != nil {
			t.Fatalf("call %d during the rotation: %v", calls, err)
		}
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d calls the served certificate is still %s (before %s), want %s", calls, got, before, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("us-east served certificate %s → %s after %d calls, none failed", before, want, calls)
}

// TestPlaintextAndTLSFlags: plain text needs --insecure (tlsx.ListenRule, DialRule),
// which is refused on an address that is not a loopback one, for
// listeners and for links; a process with TLS reaches etcd or Redis
// without their TLS flags on loopback only; allot dev and demo choose
// plain text themselves, on loopback only; a server's TLS needs
// certificate, key and CA; --insecure and --tls-* are exclusive.
func TestPlaintextAndTLSFlags(t *testing.T) {
	pki := testpki.New(t)
	f := pki.Issue(t, "node", testpki.Leaf{IPs: testpki.Loopback})
	region := []string{"regional", "--config", "../../deploy/examples/limits.yaml", "--region", "us-east", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(region, "--insecure", "--grpc-addr", "0.0.0.0:0"), "grpc listen address 0.0.0.0:0: --insecure is only allowed on loopback addresses"},
		{append(region, "--insecure", "--http-addr", ":0"), "http listen address :0: --insecure is only allowed on loopback addresses"},
		{append(region, "--insecure", "--redis", "10.0.0.7:6379"), "--redis 10.0.0.7:6379: --insecure is only allowed on loopback addresses"},
		{append(region, "--insecure", "--peers", "eu-west=eu-west.example:8081"), "--peers eu-west.example:8081: --insecure is only allowed"},
		// Peer in plain text takes the region a hello or a loan declares:
		// its listener is refused on every address but a loopback one.
		{append(region, "--insecure", "--peers", "eu-west=127.0.0.1:1", "--grpc-addr", "[::]:0"), "grpc listen address [::]:0: --insecure is only allowed on loopback addresses"},
		{append(region, "--insecure", "--peers", "eu-west=127.0.0.1:1", "--grpc-addr", "10.0.0.7:0"), "grpc listen address 10.0.0.7:0: --insecure is only allowed"},
		{append(region, "--insecure", "--coordinator", "10.0.0.1:8070"), "--coordinator 10.0.0.1:8070: --insecure is only allowed"},
		{append(region, "--tls-cert", f.Cert, "--tls-key", f.Key), "--tls-cert, --tls-key and --tls-ca go together on a server"},
		{append(region, "--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--insecure"), "--insecure and --tls-* flags are exclusive"},
		{append(region, "--tls-cert", f.Cert, "--tls-key", f.Cert, "--tls-ca", f.CA), "tlsx: certificate"},
		{append(region, "--redis", "127.0.0.1:1", "--redis-tls-cert", f.Cert), "--redis-tls-cert and --redis-tls-key go together"},
		{[]string{"coordinator", "--etcd", "10.0.0.1:2379", "--insecure"}, "--etcd 10.0.0.1:2379: --insecure is only allowed on loopback addresses"},
		{[]string{"etcd", "--client-addr", "0.0.0.0:2379", "--insecure", "--data-dir", t.TempDir()}, "client listen address 0.0.0.0:2379: --insecure is only allowed"},
		{[]string{"etcd", "--tls-cert", f.Cert, "--tls-key", f.Key, "--data-dir", t.TempDir()}, "go together on a server"},
		{region, "grpc listen address 127.0.0.1:0: plain text needs --insecure"},
		{append(region, "--peers", "eu-west=127.0.0.1:1"), "--peers 127.0.0.1:1: plain text needs --insecure"},
		{[]string{"coordinator", "--etcd", "127.0.0.1:2379"}, "--etcd 127.0.0.1:2379: plain text needs --insecure"},
		{[]string{"etcd", "--data-dir", t.TempDir()}, "client listen address 127.0.0.1:2379: plain text needs --insecure"},
		{[]string{"etcd", "--insecure", "--peer-addr", "0.0.0.0:2380", "--data-dir", t.TempDir()}, "--peer-addr 0.0.0.0:2380: the peer listener serves plain text, on loopback only"},
		{append(region, "--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--redis", "10.0.0.7:6379"), "--redis 10.0.0.7:6379: a link without TLS is only allowed to a loopback address"},
		{[]string{"coordinator", "--etcd", "10.0.0.1:2379", "--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}, "--etcd 10.0.0.1:2379: a link without TLS is only allowed"},
		{[]string{"dev", "--grpc-addr", "0.0.0.0:0", "--http-addr", "127.0.0.1:0", "--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0"}, "--insecure is only allowed on loopback addresses"},
		{[]string{"dev", "--etcd-addr", "0.0.0.0:0"}, "--etcd-addr 0.0.0.0:0: the embedded etcd serves plain text, on loopback only"},
		{[]string{"demo", "--dashboard-addr", "0.0.0.0:0"}, "dashboard http listen address 0.0.0.0:0: --insecure is only allowed"},
		{[]string{"dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coordinator-addr", "0.0.0.0:0", "--etcd-addr", "127.0.0.1:0"}, "coordinator grpc listen address 0.0.0.0:0: --insecure is only allowed"},
		{[]string{"demo", "--grpc-addr", "[::]:0", "--http-addr", "127.0.0.1:0", "--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0", "--dashboard-addr", "127.0.0.1:0"}, "grpc listen address [::]:0: --insecure is only allowed"},
	} {
		err := run(t.Context(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
}

// TestRegionalRedisOverTLSAndACL: two instances of a region share an
// exact limit (on_failure: closed) through a Redis that serves TLS only,
// requires client certificates and knows one ACL user; the password comes
// from --redis-password-file. Together they admit the limit: every
// decision went through Redis.
func TestRegionalRedisOverTLSAndACL(t *testing.T) {
	testdep.Long(t, "builds and runs the binary")
	pki := testpki.New(t)
	redisFiles := pki.Issue(t, "redis", testpki.Leaf{IPs: testpki.Loopback})
	enforcer := pki.Issue(t, "enforcer", testpki.Leaf{IPs: testpki.Loopback, URIs: []string{"spiffe://allot/region/test/instance/i1"}})
	cli, err := tlsx.NewSource(tlsx.Files(enforcer), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartSecure(t, redistest.Secure{CertFile: redisFiles.Cert, KeyFile: redisFiles.Key, CAFile: pki.CAFile,
		Client: cli.ClientConfig(""), Username: "allot", Password: "pa55 word"})
	dir := t.TempDir()
	pw := filepath.Join(dir, "redis-password")
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(pw, []byte("pa55 word\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 5/1h, enforcement: exact, on_failure: closed}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := buildAllot(t)
	var addrs []string
	for range 2 {
		_, addr := startAllot(t, bin, "regional", "--insecure", "--config", cfg, "--region", "test", "--grpc-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--redis", srv.Addr, "--store-timeout", "1s",
			"--redis-tls-cert", enforcer.Cert, "--redis-tls-key", enforcer.Key, "--redis-tls-ca", enforcer.CA,
			"--redis-user", "allot", "--redis-password-file", pw)
		addrs = append(addrs, addr)
	}
	ok := 0
	for i := range 10 {
		if check(t, addrs[i%2], "a") == 200 {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("two instances admitted %d of 10, want the limit, 5", ok)
	}
}
