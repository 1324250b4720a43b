package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/pki"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// bannerField is the word after label in a banner.
func bannerField(t *testing.T, banner, label string) string {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(label) + `\s+(\S+)`).FindStringSubmatch(banner)
	if m == nil {
		t.Fatalf("banner lacks %q:\n%s", label, banner)
	}
	return m[1]
}

// regionLine is a region's line of allot dev's and demo's banner.
var regionLine = regexp.MustCompile(`region (\S+)\s+gRPC (\S+)\s+HTTP (\S+)`)

// devRegions are the regions' gRPC and HTTP addresses in a banner.
func devRegions(t *testing.T, banner string) (grpcAddr, httpURL map[string]string) {
	t.Helper()
	grpcAddr, httpURL = map[string]string{}, map[string]string{}
	for _, m := range regionLine.FindAllStringSubmatch(banner, -1) {
		grpcAddr[m[1]], httpURL[m[1]] = m[2], m[3]
	}
	if len(grpcAddr) == 0 {
		t.Fatalf("no region in the banner:\n%s", banner)
	}
	return grpcAddr, httpURL
}

// devSource loads the certificate allot dev issued under name in dir.
func devSource(t *testing.T, dir, name string) *tlsx.Source {
	t.Helper()
	src, err := tlsx.NewSource(tlsx.Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.crt")}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func dialWith(t *testing.T, src *tlsx.Source, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, src.DialOption(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// peerHello opens a Sync stream to a region with hello and returns how it
// ends: nil once the region answers with its own hello.
func peerHello(ctx context.Context, t *testing.T, c allotv1.PeerClient, hello *allotv1.SyncHello) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&allotv1.SyncMessage{Hello: hello}); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		return err
	}
	if m.GetHello() == nil {
		t.Fatalf("answered %v, want a hello", m)
	}
	return nil
}

// metric is the sum of the samples of a metric whose line holds every
// one of labels, in a /metrics page.
func metric(page, name string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		if f := strings.Fields(line); len(f) == 2 {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// TestDemoTLSIdentities: allot demo --tls (allot dev's cluster, its
// regions linked through the demo's relays) issues every region, the
// coordinator and its clients a certificate of their own, named by the
// convention (spiffe://allot/region/R/instance/R-1, ...): the regions get
// their grants and sync with their peers over mutual TLS and the story
// plays, while a peer using us-east's certificate that claims to be
// ap-south (in a Sync hello, a Lend, a Connect) is refused with
// PERMISSION_DENIED and counted. With one certificate for every region,
// as before, any region could speak as another. The coordinator's Admin
// API answers the operator's certificate and refuses a region's.
func TestDemoTLSIdentities(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "tls")
	d := startDemo(t, "--tls", "--tls-dir", dir, "--speed", "4", "--interval", "100ms")
	waitFor(t, 60*time.Second, "story playing", func() bool { return strings.Contains(d.out.String(), "Playing a story") })
	banner := d.out.String()
	for _, want := range []string{"mutual TLS on every link", "spiffe://allot/region/REGION/instance/REGION-1",
		"export ALLOT_TLS_CA=" + filepath.Join(dir, "ca.crt") + " ALLOT_TLS_CERT=" + filepath.Join(dir, "operator.crt"),
		"dashboard        https://127.0.0.1:"} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}
	grpcAddr, httpURL := devRegions(t, banner)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Each region's certificate names it, and it only.
	for r := range grpcAddr {
		id, err := devSource(t, dir, "region-"+r).Identity()
		if err != nil || id.URI != "spiffe://allot/region/"+r+"/instance/"+r+"-1" {
			t.Errorf("region %s's certificate: %+v, %v", r, id, err)
		}
	}
	usEast := devSource(t, dir, "region-us-east")
	// Every region holds its grant, got over mutual TLS with its own
	// certificate (before the story cuts one off).
	hc, _ := usEast.HTTPClient("")
	for r := range httpURL {
		waitFor(t, 20*time.Second, r+"'s grant (/readyz)", func() bool {
			resp, err := hc.Get(httpURL[r] + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	euWest := allotv1.NewPeerClient(dialWith(t, usEast, grpcAddr["eu-west"]))

	// us-east's certificate claiming ap-south: refused.
	if err := peerHello(ctx, t, euWest, &allotv1.SyncHello{Region: "ap-south", Instance: "ap-south-1"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Sync hello of ap-south with us-east's certificate: %v, want PermissionDenied", err)
	} else {
		t.Logf("forged Sync: %v", err)
	}
	w := uint64(time.Now().UnixNano() / int64(time.Minute))
	if resp, err := euWest.Lend(ctx, &allotv1.LendRequest{Region: "ap-south", Domain: "api", Limit: "per-user", Key: "per-user:user=42",
		Window: w, Amount: 5, LoanId: 1}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Lend for ap-south with us-east's certificate: %v, %v; want PermissionDenied", resp, err)
	}
	// Its own hello is taken.
	if err := peerHello(ctx, t, euWest, &allotv1.SyncHello{Region: "us-east", Instance: "us-east-1"}); err != nil {
		t.Errorf("us-east's own Sync hello: %v", err)
	}
	// The coordinator: us-east's certificate cannot connect as ap-south.
	coord := bannerField(t, banner, "admin API        gRPC")
	st, err := allotv1.NewCoordinatorClient(dialWith(t, usEast, coord)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Hello{Hello: &allotv1.Hello{Domain: "api", Region: "ap-south", Instance: "ap-south-1"}}}); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Connect as ap-south with us-east's certificate: %v, want PermissionDenied", err)
	}

	// The coordinator's Admin API: the operator reads, a region cannot.
	operator := devSource(t, dir, "operator")
	if _, err := allotv1.NewAdminClient(dialWith(t, operator, coord)).History(ctx, &allotv1.HistoryRequest{}); err != nil {
		t.Errorf("History with the operator's certificate: %v", err)
	}
	if _, err := allotv1.NewAdminClient(dialWith(t, usEast, coord)).History(ctx, &allotv1.HistoryRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("History with us-east's certificate: %v, want PermissionDenied", err)
	}

	// The regions' own links work over mutual TLS: eu-west hears its
	// peers, and refused exactly the two forged calls above.
	page := func(region string) string {
		resp, err := hc.Get(httpURL[region] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s /metrics: %s", region, resp.Status)
		}
		return string(b)
	}
	waitFor(t, 30*time.Second, "eu-west's messages from both peers", func() bool {
		p := page("eu-west")
		return metric(p, "allot_peer_messages_total", `direction="in"`, `peer="us-east"`) > 0 &&
			metric(p, "allot_peer_messages_total", `direction="in"`, `peer="ap-south"`) > 0
	})
	if got := metric(page("eu-west"), "allot_peer_rejections_total", `reason="identity"`); got != 2 {
		t.Errorf("eu-west's identity rejections: %v, want 2 (the forged Sync and Lend)", got)
	}
	// The story's calls (Check, Reserve, Settle; Status and Usage for the
	// dashboard) pass with the demo's certificate.
	waitFor(t, 30*time.Second, "a chapter after the first", func() bool { return strings.Contains(d.out.String(), "Chapter 2 of 6") })
	for _, bad := range []string{"call failed", "PermissionDenied", "Unauthenticated", "certificate"} {
		if strings.Contains(d.errs.String(), bad) {
			t.Errorf("stderr holds %q:\n%s", bad, d.errs.String())
		}
	}
}

// TestDevTLSFlags: allot dev's TLS flags: --tls-ca goes with --tls-ca-key,
// and signs the certificates instead of a throwaway CA; --tls-dir needs
// --tls; --insecure excludes --tls; a region's name must fit a URI.
func TestDevTLSFlags(t *testing.T) {
	base := []string{"dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0"}
	ca, err := pki.NewCA("a user's CA", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(base, "--tls-ca", caFile), "--tls-ca and --tls-ca-key go together"},
		{append(base, "--tls-dir", t.TempDir()), "--tls-dir needs --tls"},
		{append(base, "--tls", "--insecure"), "--insecure and --tls flags are exclusive"},
		{append(base, "--tls", "--regions", "us-east,a/b"), `"a/b" cannot name a certificate`},
		{append(base, "--tls-ca", caFile, "--tls-ca-key", caFile), "--tls-ca, --tls-ca-key"},
	} {
		err := run(t.Context(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}

	// --tls-ca and --tls-ca-key: the certificates are the user's CA's.
	keyFile := filepath.Join(t.TempDir(), "ca.key")
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := startDevRun(t, "--regions", "us-east,eu-west", "--tls-ca", caFile, "--tls-ca-key", keyFile, "--tls-dir", dir)
	if !strings.Contains(d.out.String(), "issued by the CA of --tls-ca") {
		t.Errorf("banner:\n%s", d.out.String())
	}
	src, err := tlsx.NewSource(tlsx.Files{Cert: filepath.Join(dir, "operator.crt"), Key: filepath.Join(dir, "operator.key"), CA: caFile}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := allotv1.NewAdminClient(dialWith(t, src, d.banner(t, "admin API        gRPC"))).Status(t.Context(), &allotv1.StatusRequest{}); err != nil {
		t.Errorf("Status with the operator's certificate of the user's CA: %v", err)
	}
}
