package main

import (
	"bytes"
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

	"github.com/allot-dev/allot/internal/testdep"
)

// buildAllot builds the allot binary once per test run.
func buildAllot(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "allot")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startAllot starts the binary and returns its HTTP address, read from
// the banner it prints.
func startAllot(t *testing.T, bin string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	return startProcess(t, bin, regexp.MustCompile(`HTTP\s+http://(\S+)`), args...)
}

func check(t *testing.T, addr, user string) int {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
		strings.NewReader(`{"domain":"api","descriptors":[{"user":"`+user+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// admitted counts how many of n requests in a row pass.
func admitted(t *testing.T, addr, user string, n int) int {
	ok := 0
	for range n {
		if check(t, addr, user) == 200 {
			ok++
		}
	}
	return ok
}

func TestRegionalProcessReloadAndShutdown(t *testing.T) {
	testdep.Long(t, "builds and runs the binary")
	bin := buildAllot(t)
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	write := func(s string) {
		if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 3/1h}\n")
	cmd, addr := startAllot(t, bin, "regional", "--insecure", "--config", cfg, "--region", "test", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")

	if got := admitted(t, addr, "a", 5); got != 3 {
		t.Fatalf("admitted %d of 5, want 3", got)
	}
	// A bad file is refused: the old limit stays.
	write("domain: api\nlimits:\n  - {name: per-user, rate: 0/1h}\n")
	cmd.Process.Signal(syscall.SIGHUP)
	write("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 3/1h}\n  - {name: broken\n")
	cmd.Process.Signal(syscall.SIGHUP)
	if got := admitted(t, addr, "b", 5); got != 3 {
		t.Fatalf("after a bad reload: admitted %d of 5, want 3", got)
	}
	// A good file is taken: poll until the new limit is in force.
	write("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 7/1h}\n")
	cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if got := admitted(t, addr, "c"+string(rune('a'+i)), 8); got == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reloaded limit of 7/1h never took effect")
		}
	}
	// SIGTERM stops it cleanly.
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit 15s after SIGTERM")
	}
}

func TestDevServesTheExample(t *testing.T) {
	testdep.Long(t, "builds and runs the binary")
	bin := buildAllot(t)
	_, addr := startAllot(t, bin, "dev", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--coordinator-addr", "127.0.0.1:0", "--etcd-addr", "127.0.0.1:0")
	codes := []int{}
	for range 6 {
		codes = append(codes, check(t, addr, "42"))
	}
	if codes[4] != 200 || codes[5] != 429 {
		t.Fatalf("codes: %v, want five 200 then a 429", codes)
	}
}

func TestRunErrors(t *testing.T) {
	var out, errb bytes.Buffer
	cases := [][]string{
		{},
		{"nope"},
		{"regional", "--config", "x.yaml"},
		{"regional", "--region", "r"},
		{"regional", "--region", "r", "--config", "/does/not/exist.yaml"},
		{"regional", "--region", "r", "--config", "../../deploy/examples/limits.yaml", "--persist-slack", "0"},
		{"regional", "--region", "r", "--config", "../../deploy/examples/limits.yaml", "--persist-interval", "-1s"},
		{"dev", "--log-level", "loud"},
		{"check", "--count", "0"},
		{"check", "--descriptor", "=x"},
		{"validate"},
	}
	for _, args := range cases {
		if err := run(t.Context(), args, &out, &errb); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
}
