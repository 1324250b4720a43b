package loadgen

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/internal/testpki"
	"github.com/allot-dev/allot/internal/tlsx"
)

// healthTarget admits every key with one health check per call.
type healthTarget struct{ c healthpb.HealthClient }

func (h healthTarget) Check(ctx context.Context, keys []int) (int, error) {
	_, err := h.c.Check(ctx, &healthpb.HealthCheckRequest{})
	return len(keys), err
}

// TestMainOverTLS: --tls-ca (or ALLOT_TLS_CA) makes the load TLS; a TLS
// server is not reached in plain text; --insecure to an address that is
// not a loopback one is refused.
func TestMainOverTLS(t *testing.T) {
	pki := testpki.New(t)
	src, err := tlsx.NewSource(tlsx.Files(pki.Issue(t, "server", testpki.Leaf{IPs: testpki.Loopback})), tlsx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := src.ServerOptions(0)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	systems := map[string]System{"health": func(conn grpc.ClientConnInterface, _ string) Target {
		return healthTarget{healthpb.NewHealthClient(conn)}
	}}
	load := []string{"--system", "health", "--target", l.Addr().String(), "--duration", "100ms", "--concurrency", "2", "--keys", "4"}

	var out bytes.Buffer
	if err := Main(t.Context(), "bench", systems, append(load, "--tls-ca", pki.CAFile), &out, io.Discard); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	if !strings.Contains(out.String(), "errors      0\n") {
		t.Fatalf("over TLS:\n%s", out.String())
	}
	t.Setenv("ALLOT_TLS_CA", pki.CAFile)
	if err := Main(t.Context(), "bench", systems, load, io.Discard, io.Discard); err != nil {
		t.Fatalf("with ALLOT_TLS_CA: %v", err)
	}
	t.Setenv("ALLOT_TLS_CA", "")
	short, cancel := context.WithTimeout(t.Context(), time.Second) // the handshake fails; no need for the whole connect timeout
	defer cancel()
	if err := Main(short, "bench", systems, append(load, "--insecure"), io.Discard, io.Discard); err == nil {
		t.Fatal("plain text to a TLS server: no error")
	}
	err = Main(t.Context(), "bench", systems, []string{"--system", "health", "--target", "192.0.2.1:8081", "--insecure"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "only allowed on loopback") {
		t.Fatalf("--insecure to 192.0.2.1: %v", err)
	}
}
