package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/deploy/local"
	"github.com/allot-dev/allot/internal/testdep"
)

// allot cluster up starts 12 processes in the background; status sees
// them, leaders included; the cluster answers checks; down stops them
// all, and status then says so.
func TestClusterUpStatusDown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a cluster of 12 processes")
	}
	testdep.LookPath(t, "redis-server", "apt-get install redis-server; .ci/run installs it")
	bin := buildAllot(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	allot := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	t.Cleanup(func() {
		// Whatever happened, nothing outlives the test.
		allot("cluster", "down", "--dir", dir, "--grace", "2s")
		if c, err := local.Load(dir); err == nil {
			for _, p := range c.Procs {
				if c.Running(p) {
					syscall.Kill(p.Pid, syscall.SIGKILL)
				}
			}
		}
	})
	out, err := allot("cluster", "up", "--dir", dir, "--base-port", "0", "--timeout", "60s")
	if err != nil {
		t.Fatalf("cluster up: %v\n%s", err, out)
	}
	upOut := out
	for _, s := range []string{"12 processes up", "us-east-1", "ap-south-2", "redis-eu-west", "coordinator-2", "leaders: api: coordinator-"} {
		if !strings.Contains(out, s) {
			t.Errorf("cluster up printed no %q:\n%s", s, out)
		}
	}
	if out, err := allot("cluster", "up", "--dir", dir, "--base-port", "0"); err == nil || !strings.Contains(out, "runs in") {
		t.Errorf("a second cluster up in the same folder: %v\n%s", err, out)
	}
	out, err = allot("cluster", "status", "--dir", dir)
	if err != nil || strings.Count(out, "running") != 12 {
		t.Fatalf("cluster status: %v\n%s", err, out)
	}

	var st struct {
		Procs []local.Proc `json:"procs"`
	}
	b, err := os.ReadFile(filepath.Join(dir, local.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	var addr string
	for _, p := range st.Procs {
		if p.Name == "eu-west-2" {
			addr = p.HTTP
		}
	}
	// Mutual TLS on every link: checks over HTTPS verified by the
	// cluster's CA; plain HTTP is refused.
	c, err := local.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ClientTLS()
	if err != nil || cfg == nil {
		t.Fatalf("the cluster's TLS: %v, %v", cfg, err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	// eu-west-2 is its region's second instance: its part of per-user is
	// in force from its grant, so a token bucket starts empty then and
	// fills at its part of the rate (5/s): the first checks right after
	// it is ready may be rejected. Over HTTPS, one is admitted soon.
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		resp, err := hc.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"user":"cluster"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if resp.StatusCode != 429 || time.Since(start) > 5*time.Second {
			t.Fatalf("a check on eu-west-2 over HTTPS: %s", resp.Status)
		}
	}
	if code := check(t, addr, "cluster"); code == 200 {
		t.Fatal("a plain-text check on eu-west-2 was answered")
	}
	op := c.Files("operator")
	for _, s := range []string{"transport: mutual TLS on every link", "ALLOT_TLS_CERT=" + op.Cert, "ALLOT_TLS_CA=" + op.CA, "curl -s --cacert"} {
		if !strings.Contains(upOut, s) {
			t.Errorf("cluster up printed no %q:\n%s", s, upOut)
		}
	}

	out, err = allot("cluster", "down", "--dir", dir)
	if err != nil || strings.Count(out, "(SIGTERM)") != 12 {
		t.Fatalf("cluster down: %v; want every process stopped by SIGTERM:\n%s", err, out)
	}
	out, err = allot("cluster", "status", "--dir", dir)
	if err == nil || strings.Count(out, "stopped") != 12 {
		t.Fatalf("cluster status after down: %v\n%s", err, out)
	}
	for _, p := range st.Procs {
		if err := syscall.Kill(p.Pid, 0); err == nil {
			if b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.Pid), "stat")); !bytes.Contains(b, []byte(") Z ")) {
				t.Errorf("%s (pid %d) still runs after down", p.Name, p.Pid)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "logs", "coordinator-1.log")); err != nil {
		t.Errorf("logs: %v", err)
	}
}

func TestClusterErrors(t *testing.T) {
	var out, errb bytes.Buffer
	empty := t.TempDir()
	for _, args := range [][]string{
		{"cluster"},
		{"cluster", "sideways"},
		{"cluster", "up", "extra"},
		{"cluster", "up", "--regions", "a,a", "--dir", empty},
		{"cluster", "down", "--dir", empty},
		{"cluster", "status", "--dir", empty},
		{"etcd", "extra"},
		{"etcd", "--client-addr", "192.0.2.1:2379", "--data-dir", filepath.Join(empty, "etcd")},
	} {
		if err := run(t.Context(), args, &out, &errb); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}
