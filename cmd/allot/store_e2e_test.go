package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/internal/testdep"
)

// Two instances of a region share an exact limit through the regional
// Redis: together they admit the limit, not twice it.
func TestRegionalInstancesShareRedis(t *testing.T) {
	testdep.Long(t, "builds and runs the binary")
	srv := redistest.Start(t)
	bin := buildAllot(t)
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 5/1h, enforcement: exact, on_failure: closed}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for range 2 {
		_, addr := startAllot(t, bin, "regional", "--insecure", "--config", cfg, "--region", "test", "--grpc-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--redis", srv.Addr, "--store-timeout", "1s")
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
