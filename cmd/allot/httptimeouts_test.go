package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/httpx"
)

// A region's HTTP server disconnects a client that sends headers and never
// a body within the read timeout, and closes idle keep-alive connections
// after the idle timeout (they were held for ever: only ReadHeaderTimeout
// was set).
func TestRegionalHTTPTimeouts(t *testing.T) {
	const short = 300 * time.Millisecond
	saved := httpTimeouts
	httpTimeouts = httpx.Timeouts{ReadHeader: short, Read: short, Write: time.Second, Idle: short}
	t.Cleanup(func() { httpTimeouts = saved })

	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 3/1h}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"regional", "--insecure", "--config", cfg, "--region", "test",
			"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("regional did not stop")
		}
	})
	addrc := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`HTTP\s+http://(\S+)`)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("regional returned %v before serving", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no HTTP address in the banner")
	}

	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closed waits (blocked on a read with a deadline) for the server to
	// close c.
	var deadline time.Time
	closed := func(c net.Conn, what string) {
		c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: connection still open 3s past the timeout", what)
		}
	}

	var silent []net.Conn
	for range 20 {
		c := dial()
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
		silent = append(silent, c)
	}
	var idle []net.Conn
	for range 20 {
		c := dial()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("healthz: %v, %v; want 200 on a kept-alive connection", resp, err)
		}
		resp.Body.Close()
		idle = append(idle, c)
	}
	deadline = time.Now().Add(short + 3*time.Second)
	for _, c := range silent {
		closed(c, "headers without a body")
	}
	for _, c := range idle {
		closed(c, "idle keep-alive")
	}
}
