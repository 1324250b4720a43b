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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/deploy/examples"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/server"
)

// regionFlags are the flags of every command that serves a region.
type regionFlags struct {
	config   string
	region   string
	grpcAddr string
	httpAddr string
	maxKeys  int
	logLevel string
}

func (f *regionFlags) register(fs *flag.FlagSet, grpcAddr, httpAddr string) {
	fs.StringVar(&f.config, "config", "", "limits file (allot or Envoy ratelimit format); default: the built-in "+examples.LimitsName)
	fs.StringVar(&f.grpcAddr, "grpc-addr", grpcAddr, "gRPC listen address (allot.v1.RateLimiter and Envoy's RateLimitService)")
	fs.StringVar(&f.httpAddr, "http-addr", httpAddr, "HTTP listen address (/v1/check, /healthz, /readyz, /metrics)")
	fs.IntVar(&f.maxKeys, "max-keys", regional.DefaultMaxKeys, "bound of the key table")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
}

func (f *regionFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})), nil
}

func runRegional(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allot regional", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f regionFlags
	f.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	fs.StringVar(&f.region, "region", "", "name of the region this enforcer serves (required)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot regional --config FILE --region NAME [flags]\n\nServes one region's enforcer. SIGHUP reloads --config; SIGINT/SIGTERM stop gracefully.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if f.region == "" {
		return errors.New("regional: --region is required")
	}
	if f.config == "" {
		return errors.New("regional: --config is required (allot dev runs the built-in example)")
	}
	return serveRegion(ctx, f, stdout, stderr, false)
}

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("allot dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f regionFlags
	f.register(fs, "127.0.0.1:8081", "127.0.0.1:8080")
	fs.StringVar(&f.region, "region", "local", "name of the region")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot dev [flags]\n\nThe embedded default: one process, in-memory enforcement, the built-in example limits.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	return serveRegion(ctx, f, stdout, stderr, true)
}

// serveRegion serves one region until ctx ends, reloading the config on
// SIGHUP.
func serveRegion(ctx context.Context, f regionFlags, stdout, stderr io.Writer, dev bool) error {
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(f.config)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engine := regional.New(cfg, regional.Options{MaxKeys: f.maxKeys})
	svc := server.New(engine, server.Options{Region: f.region, Registry: reg, Logger: log})

	gl, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	hl, err := net.Listen("tcp", f.httpAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	hs := &http.Server{Handler: svc.HTTPHandler(server.HTTPOptions{Gatherer: reg}), ReadHeaderTimeout: 5 * time.Second}

	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() { errc <- hs.Serve(hl) }()
	printBanner(stdout, f, cfg, gl.Addr().String(), hl.Addr().String(), dev)
	log.Info("serving", "region", f.region, "grpc", gl.Addr().String(), "http", hl.Addr().String())

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if next, err := loadConfig(f.config); err != nil {
				log.Error("reload refused; the previous config stays in force", "err", err)
			} else {
				svc.SetConfig(next)
				log.Info("config reloaded", "source", next.Source, "domains", len(next.Domains))
			}
		case err := <-errc:
			gs.Stop()
			hs.Close()
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			log.Info("shutting down")
			shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() { gs.GracefulStop(); close(done) }()
			herr := hs.Shutdown(shut)
			select {
			case <-done:
			case <-shut.Done():
				gs.Stop()
			}
			return herr
		}
	}
}

func printBanner(w io.Writer, f regionFlags, cfg *allot.Config, grpcAddr, httpAddr string, dev bool) {
	source := cfg.Source
	fmt.Fprintf(w, "allot: region %s serving %d domain(s) from %s\n", f.region, len(cfg.Domains), source)
	fmt.Fprintf(w, "  gRPC  %s  (allot.v1.RateLimiter, envoy.service.ratelimit.v3.RateLimitService)\n", grpcAddr)
	fmt.Fprintf(w, "  HTTP  http://%s  (POST /v1/check, /healthz, /readyz, /metrics)\n", httpAddr)
	if dev {
		fmt.Fprintf(w, "\nTry it (user 42 may send 10/s with a burst of 5; the 6th request in a row gets a 429):\n")
		fmt.Fprintf(w, "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%%{http_code}\\n' -X POST http://%s/v1/check \\\n", httpAddr)
		fmt.Fprintf(w, "    -H 'Content-Type: application/json' -d '{\"domain\":\"api\",\"descriptors\":[{\"user\":\"42\"}]}'; done\n")
		fmt.Fprintf(w, "Stop with Ctrl-C.\n")
	}
}
