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
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// TestBenchAgainstAService runs `allot bench` for a second against a real
// gRPC server on loopback. Twenty keys of the example per-user limit
// (10/s, burst 5) cannot absorb the load, so some checks are rejected.
func TestBenchAgainstAService(t *testing.T) {
	cfg, err := allot.ParseConfig(examples.LimitsName, examples.LimitsYAML)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	server.New(regional.New(cfg, regional.Options{}), server.Options{Region: "bench"}).RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)

	for _, load := range [][]string{
		{"--concurrency", "8"},
		{"--concurrency", "8", "--rate", "500", "--batch", "2", "--zipf", "1.2", "--conns", "2"},
	} {
		var stdout bytes.Buffer
		args := append([]string{"--target", l.Addr().String(), "--duration", "1s", "--keys", "20"}, load...)
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
