package httpx

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// serve starts a server of h with t on a loopback listener and returns its
// address and a count of its open connections.
func serve(t *testing.T, h http.Handler, tm Timeouts) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := Server(h, tm)
	var open atomic.Int64
	hs.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	return l.Addr().String(), &open
}

// closedBy reads c until the server closes it and fails t unless that
// happens before deadline. It blocks on the read (with the deadline); it
// does not sleep.
func closedBy(t *testing.T, c net.Conn, deadline time.Time) {
	t.Helper()
	c.SetReadDeadline(deadline)
	_, err := io.Copy(io.Discard, c) // nil at EOF
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open at the deadline")
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, deadline time.Time, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not by the deadline", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not a wait for the event
	}
}

// readBody is like allot's handlers: it reads the request's body first.
var readBody = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.ReadAll(r.Body); err != nil {
		return
	}
	io.WriteString(w, "ok\n")
})

// A client that sends headers and never a body is disconnected within the
// read timeout.
func TestReadTimeoutDisconnectsSilentBody(t *testing.T) {
	const read = 300 * time.Millisecond
	addr, open := serve(t, readBody, Timeouts{ReadHeader: read, Read: read, Write: time.Second, Idle: time.Second})
	const clients = 20
	conns := make([]net.Conn, clients)
	start := time.Now()
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
		conns[i] = c
	}
	deadline := start.Add(read + 2*time.Second)
	for _, c := range conns {
		closedBy(t, c, deadline)
	}
	waitFor(t, deadline, "server side closed", func() bool { return open.Load() == 0 })
	if took := time.Since(start); took < read {
		t.Errorf("closed after %v, before the read timeout %v", took, read)
	}
}

// Idle keep-alive connections are closed after the idle timeout.
func TestIdleTimeoutClosesKeepAlive(t *testing.T) {
	const idle = 300 * time.Millisecond
	addr, open := serve(t, readBody, Timeouts{ReadHeader: time.Second, Read: time.Second, Write: time.Second, Idle: idle})
	const clients = 50
	conns := make([]net.Conn, clients)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("response %v, %v: want 200 on a kept-alive connection", resp, err)
		}
		resp.Body.Close()
		conns[i] = c
	}
	idleFrom := time.Now()
	if n := open.Load(); n != clients {
		t.Fatalf("%d open connections, want %d", n, clients)
	}
	deadline := idleFrom.Add(idle + 2*time.Second)
	for _, c := range conns {
		closedBy(t, c, deadline)
	}
	waitFor(t, deadline, "server side closed", func() bool { return open.Load() == 0 })
}

func TestDefaultSetsEveryTimeout(t *testing.T) {
	hs := Server(http.NotFoundHandler(), Default)
	if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout <= 0 || hs.WriteTimeout <= 0 || hs.IdleTimeout <= 0 {
		t.Errorf("Default server %+v: want every timeout set", hs)
	}
	if p := Server(http.NotFoundHandler(), Proxy); p.WriteTimeout != 0 || p.ReadTimeout <= 0 || p.IdleTimeout <= 0 {
		t.Errorf("Proxy server: want read and idle timeouts and no write timeout")
	}
}
