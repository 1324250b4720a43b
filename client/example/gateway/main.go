// Command gateway is an example HTTP gateway that rate-limits its requests
// with the allot Go SDK and client.Middleware: it decides in process from
// leases its regional enforcer grants, and answers 429 with Retry-After,
// RateLimit-Policy, RateLimit and X-RateLimit-* headers, as the enforcer's
// own HTTP API does.
//
// Each request is described by one descriptor built from its headers and
// connection, for the limits of deploy/examples/limits.yaml's "api"
// domain:
//
//	tenant=<X-Tenant>  (if set)   per-tenant
//	user=<X-User>      (if set)   per-user, per-tenant-user-chat
//	route=<path>                  per-tenant-user-chat (/v1/chat), login-attempts (/login)
//	ip=<client address>           login-attempts
//
// It forwards allowed requests to --upstream, or, without one, answers
// them itself. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/httpx"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gateway:", err)
		}
		os.Exit(1)
	}
}

// maxValue bounds a descriptor value taken from a header.
const maxValue = 256

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	enforcers := fs.String("enforcers", "127.0.0.1:8081", "comma-separated gRPC addresses of the region's enforcers (default: allot dev's us-east)")
	domain := fs.String("domain", "api", "the limits' domain")
	listen := fs.String("listen", "127.0.0.1:9000", "the gateway's HTTP listen address")
	upstream := fs.String("upstream", "", "URL to forward allowed requests to; empty: answer them here")
	syncInterval := fs.Duration("sync-interval", 250*time.Millisecond, "how often the SDK reports usage and renews leases")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var addrs []string
	for a := range strings.SplitSeq(*enforcers, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return errors.New("--enforcers is empty")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	backend := http.Handler(http.HandlerFunc(hello))
	if *upstream != "" {
		u, err := url.Parse(*upstream)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return fmt.Errorf("--upstream %q: want a URL such as http://127.0.0.1:8000", *upstream)
		}
		backend = httputil.NewSingleHostReverseProxy(u)
	}

	// TLS to the enforcers from ALLOT_TLS_CA, ALLOT_TLS_CERT and
	// ALLOT_TLS_KEY (allot dev --tls prints the gateway's), CA and
	// certificate read at every new connection; none: plain text.
	creds, err := client.CredentialsFromEnv()
	if err != nil {
		return err
	}
	var dial []grpc.DialOption
	if creds != nil {
		dial = append(dial, grpc.WithTransportCredentials(creds))
	}
	c, err := client.New(client.Config{Addrs: addrs, SyncInterval: *syncInterval, DialOptions: dial})
	if err != nil {
		return fmt.Errorf("allot client: %w", err)
	}
	defer c.Close()

	limit := client.Middleware(c, client.MiddlewareOptions{
		Domain:      *domain,
		Descriptors: descriptors,
		Logger:      log,
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("/", limit(backend))

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := httpx.Server(mux, httpx.Proxy) // no write timeout: an upstream's response may stream
	fmt.Fprintf(stdout, "gateway: listening on http://%s (domain %q, enforcers %s)\n", lis.Addr(), *domain, strings.Join(addrs, ","))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

// descriptors describes a request by one descriptor (see the package
// comment); every request costs one hit.
func descriptors(r *http.Request) ([]allot.Descriptor, int64, error) {
	var d allot.Descriptor
	for _, h := range []struct{ header, key string }{{"X-Tenant", "tenant"}, {"X-User", "user"}} {
		v := r.Header.Get(h.header)
		if v == "" {
			continue
		}
		if len(v) > maxValue {
			return nil, 0, fmt.Errorf("%s is %d bytes, at most %d", h.header, len(v), maxValue)
		}
		d = append(d, allot.Entry{Key: h.key, Value: v})
	}
	d = append(d, allot.Entry{Key: "route", Value: r.URL.Path})
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	d = append(d, allot.Entry{Key: "ip", Value: ip})
	return []allot.Descriptor{d}, 1, nil
}

// hello answers an allowed request when there is no upstream.
func hello(w http.ResponseWriter, r *http.Request) {
	who := r.Header.Get("X-User")
	if who == "" {
		who = "anonymous"
	}
	fmt.Fprintf(w, "hello, %s: %s %s passed the rate limits\n", who, r.Method, r.URL.Path)
}
