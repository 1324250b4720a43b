package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/internal/testdep"
	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// TestRestartRestoresLongWindows runs allot etcd, allot coordinator, a
// regional Redis and one us-east instance with a certificate (its stable
// identity) and a split-mode local sliding-window limit of 100/1h. The
// instance admits 60 of a key, is killed (SIGKILL: nothing is given
// back or flushed) and restarted with the same certificate: it restores
// its counts from Redis and admits what is left of the window, 40, less
// at most the slack of 5 — never more. (Before: a restarted instance
// admitted nothing of the window until the next one.)
func TestRestartRestoresLongWindows(t *testing.T) {
	testdep.Long(t, "builds and runs four processes")
	redis := redistest.Start(t)
	// The window of the hour must not end during the test.
	if left := time.Hour - time.Duration(time.Now().UnixNano()%int64(time.Hour)); left < 2*time.Minute {
		time.Sleep(left + time.Second)
	}
	bin := buildAllot(t)
	dir := t.TempDir()
	pki := testpki.New(t)
	tlsArgs := func(f testpki.Files) []string {
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
	}
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nregions: [us-east]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h, algorithm: sliding_window}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, etcdAddr := startProcess(t, bin, regexp.MustCompile(`clients on http://(\S+)`),
		"etcd", "--insecure", "--data-dir", filepath.Join(dir, "etcd"), "--client-addr", loopbackAddr(t), "--peer-addr", loopbackAddr(t))
	coordFiles := pki.Issue(t, "coordinator", testpki.Leaf{IPs: testpki.Loopback, URIs: []string{"spiffe://allot/coordinator/c1"}})
	_, coord := startProcess(t, bin, regexp.MustCompile(`serving gRPC (\S+)`), append([]string{
		"coordinator", "--etcd", etcdAddr, "--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--rebalance-period", "500ms"}, tlsArgs(coordFiles)...)...)
	enforcer := pki.Issue(t, "enforcer", testpki.Leaf{IPs: testpki.Loopback, URIs: []string{"spiffe://allot/region/us-east/instance/i1"}})
	anon, err := tlsx.NewSource(tlsx.Files{CA: pki.CAFile}, tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hc, _ := anon.HTTPClient("")
	regional := func() (*exec.Cmd, string) {
		cmd, addr := startProcess(t, bin, regexp.MustCompile(`HTTP\s+https://(\S+)`), append([]string{
			"regional", "--config", cfg, "--region", "us-east", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--coordinator", coord, "--redis", redis.Addr, "--report-interval", "200ms"}, tlsArgs(enforcer)...)...)
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Get("https://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return cmd, addr
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 30s: %v", addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	check := func(addr string) bool {
		resp, err := hc.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"user":"1"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	// spend admits up to want, polling: a key is held at what is
	// persisted, raised every second by the slack. It stops when nothing
	// has been admitted for 3 s.
	spend := func(addr string, want int) int {
		got, last := 0, time.Now()
		for got < want && time.Since(last) < 3*time.Second {
			if check(addr) {
				got, last = got+1, time.Now()
				continue
			}
			time.Sleep(50 * time.Millisecond)
		}
		return got
	}

	first, addr := regional()
	if before := spend(addr, 60); before != 60 {
		t.Fatalf("the first life admitted %d of 60", before)
	}
	pid := first.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	_, addr = regional()
	after := spend(addr, 100)
	t.Logf("admitted 60 before SIGKILL, %d after the restart (slack 5), in one window of 100", after)
	if after > 40 {
		t.Fatalf("admitted 60 + %d in one window of 100", after)
	}
	if after < 35 {
		t.Fatalf("admitted %d after the restart, want at least 40 - the slack of 5", after)
	}
}
