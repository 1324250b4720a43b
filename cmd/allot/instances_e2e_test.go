package main

import (
	"bufio"
	"bytes"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testdep"
)

// TestLocalLimitWithSeveralInstances runs real processes as an operator
// would — allot etcd, allot coordinator, two us-east instances and one
// eu-west instance, all with --coordinator and --etcd — with one split-mode
// local limit of 100 per 10s, and sends 100 requests for one key to each
// instance at once. What all instances admit together stays within the
// limit (before instances were part of the cores: 150 of a 100/1h limit,
// each us-east instance enforcing the region's whole share), and once
// every instance has held its part for a period (an instance's part
// counts from its grant on: a bucket starts empty and refills, so that
// the part another instance gave up and may have spent is not spent
// again), the division loses next to nothing.
func TestLocalLimitWithSeveralInstances(t *testing.T) {
	testdep.Long(t, "builds and runs five processes")
	bin := buildAllot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nregions: [us-east, eu-west]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/10s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, etcdAddr := startProcess(t, bin, regexp.MustCompile(`clients on http://(\S+)`),
		"etcd", "--insecure", "--data-dir", filepath.Join(dir, "etcd"), "--client-addr", loopbackAddr(t), "--peer-addr", loopbackAddr(t))
	_, coord := startProcess(t, bin, regexp.MustCompile(`serving gRPC (\S+)`),
		"coordinator", "--insecure", "--etcd", etcdAddr, "--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--rebalance-period", "500ms")
	var addrs []string
	for _, region := range []string{"us-east", "us-east", "eu-west"} {
		_, addr := startAllot(t, bin, "regional", "--insecure", "--config", cfg, "--region", region, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--coordinator", coord, "--etcd", etcdAddr, "--report-interval", "200ms")
		addrs = append(addrs, addr)
	}
	for _, addr := range addrs {
		deadline := time.Now().Add(30 * time.Second)
		for !ready(addr) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 30s", addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(11 * time.Second) // every part held for a period: the buckets refilled
	var total atomic.Int64
	var wg sync.WaitGroup
	per := make([]int64, len(addrs))
	start := time.Now()
	for i, addr := range addrs {
		wg.Go(func() {
			for range 100 {
				if check(t, addr, "1") == http.StatusOK {
					per[i]++
					total.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// A token bucket's guarantee over an interval T: B + r·T, here
	// 100 + 10/s × the time the requests took.
	bound := 100 + int64(math.Ceil(10*time.Since(start).Seconds()))
	t.Logf("admitted per instance (us-east, us-east, eu-west): %v, total %d (bound %d)", per, total.Load(), bound)
	if n := total.Load(); n > bound {
		t.Fatalf("admitted %d with B + r·T = %d over three instances: %v", n, bound, per)
	}
	if n := total.Load(); n < 90 {
		t.Fatalf("admitted %d of L = 100: the instances hold much less than the limit", n)
	}
}

func ready(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// loopbackAddr returns a loopback address that was free a moment ago.
func loopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startProcess starts the binary and returns the first submatch of re in
// a line it prints (the process is killed at the test's end).
func startProcess(t *testing.T, bin string, re *regexp.Regexp, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("allot %s stderr:\n%s", args[0], stderr.String())
		}
	})
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return cmd, m[1]
		}
	}
	t.Fatalf("allot %s printed no address; stderr:\n%s", args[0], stderr.String())
	return nil, ""
}

// TestRestartedInstanceStartsTheWindowWithNothing restarts the only
// us-east instance of a split-mode local sliding-window limit of 100/1h
// mid-window: the new process is a new instance, which holds nothing until
// the old one's grant has expired and then holds its region's share only
// from the next window, so over both lives us-east admits at most its
// share of 50 in the window (before: 50 again after the restart, 100).
func TestRestartedInstanceStartsTheWindowWithNothing(t *testing.T) {
	testdep.Long(t, "builds and runs five processes")
	// The window of the hour must not end during the test.
	if left := time.Hour - time.Duration(time.Now().UnixNano()%int64(time.Hour)); left < time.Minute {
		time.Sleep(left + time.Second)
	}
	bin := buildAllot(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nregions: [us-east, eu-west]\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 100/1h, algorithm: sliding_window}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, etcdAddr := startProcess(t, bin, regexp.MustCompile(`clients on http://(\S+)`),
		"etcd", "--insecure", "--data-dir", filepath.Join(dir, "etcd"), "--client-addr", loopbackAddr(t), "--peer-addr", loopbackAddr(t))
	_, coord := startProcess(t, bin, regexp.MustCompile(`serving gRPC (\S+)`),
		"coordinator", "--insecure", "--etcd", etcdAddr, "--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--rebalance-period", "500ms", "--grant-ttl", "2s")
	regional := func() (*exec.Cmd, string) {
		cmd, addr := startAllot(t, bin, "regional", "--insecure", "--config", cfg, "--region", "us-east", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--coordinator", coord, "--etcd", etcdAddr, "--report-interval", "200ms")
		deadline := time.Now().Add(30 * time.Second)
		for !ready(addr) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready within 30s", addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return cmd, addr
	}
	first, addr := regional()
	before := admitted(t, addr, "1", 100)
	if before != 50 {
		t.Fatalf("the first life admitted %d of us-east's 50", before)
	}
	first.Process.Kill()
	first.Wait()
	_, addr = regional()
	after := admitted(t, addr, "1", 100)
	t.Logf("admitted %d before the restart, %d after, in one window with us-east's share of 50", before, after)
	if before+after > 50 {
		t.Fatalf("us-east admitted %d + %d in one window with a share of 50", before, after)
	}
}
