package main

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// TestBenchAgainstAService runs `allot bench` for a second against a real
// gRPC server on loopback. Twenty keys of a 1/m limit admit 20 checks,
// so a load of more than that in a second has rejections whatever the
// machine's speed.
func TestBenchAgainstAService(t *testing.T) {
	cfg, err := allot.ParseConfig("bench.yaml", []byte(`
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 1/m}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, load := range [][]string{
		{"--concurrency", "8"},
		{"--concurrency", "8", "--rate", "500", "--batch", "2", "--zipf", "1.2", "--conns", "2"},
	} {
		// A fresh server per load: every key starts full.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		server.New(regional.New(cfg, regional.Options{}), server.Options{Region: "bench"}).RegisterGRPC(gs)
		go gs.Serve(l)
		t.Cleanup(gs.Stop)
		var stdout bytes.Buffer
		args := append([]string{"--insecure", "--target", l.Addr().String(), "--duration", "1s", "--keys", "20"}, load...)
		if err := run(t.Context(), append([]string{"bench"}, args...), &stdout, io.Discard); err != nil {
			t.Fatalf("allot bench %q: %v", args, err)
		}
		got := map[string]float64{}
		for line := range strings.Lines(stdout.String()) {
			if f := strings.Fields(line); len(f) >= 2 {
				if v, err := strconv.ParseFloat(f[1], 64); err == nil {
					got[f[0]] = v
				}
			}
		}
		if got["checks"] <= 0 || got["errors"] != 0 || got["rejected"] <= 0 || got["allowed"] <= 0 ||
			got["allowed"]+got["rejected"] != got["checks"] || got["throughput"] <= 0 ||
			got["p50"] <= 0 || got["p50"] > got["p99"] || got["p99"] > got["p999"] || got["p999"] > got["max"] {
			t.Errorf("allot bench %q printed:\n%s", args, stdout.String())
		}
	}
}
