package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/allot-dev/allot/internal/demo"
	"github.com/allot-dev/allot/internal/httpx"
	"github.com/allot-dev/allot/internal/tlsx"
)

// runDemo starts the embedded default (as allot dev does) with its
// regions linked through relays it can cut, plays the demo's story
// against it, shows a live view on stdout and serves the dashboard.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("allot demo", "usage: allot demo [flags]\n\nThe embedded default (allot dev) and traffic that plays a two-minute story on it: steady traffic,\n"+
		"a demand shift, a region cut off from the coordinator and its peers and healed, a burst of LLM token\n"+
		"reservations. A live view on stdout (redrawn in place on a terminal) and a dashboard with charts at\n"+
		"--dashboard-addr. The story is written for the built-in example limits and three regions.", stderr)
	var f devFlags
	f.register(fs)
	f.demo = true
	// The view owns the terminal: only warnings go to stderr by default.
	f.logLevel = "warn"
	fs.Lookup("log-level").DefValue = f.logLevel
	// The story checks and reserves, and its dashboard reads the regions'
	// Status and Usage: nothing more is open to anonymous callers.
	f.anonymousRoles = "check,viewer"
	fs.Lookup("anonymous-roles").DefValue = f.anonymousRoles
	speed := fs.Float64("speed", 1, "play the story this many times faster (2: about a minute); request rates do not change")
	once := fs.Bool("once", false, "exit when the story ends; without it the story starts over until Ctrl-C")
	dashAddr := fs.String("dashboard-addr", "127.0.0.1:8060", "the dashboard's HTTP listen address")
	interval := fs.Duration("interval", demo.DefaultInterval, "how often the view redraws and the dashboard gets a sample")
	if _, err := parseArgs(fs, args, stdout, 0, 0); err != nil {
		return err
	}
	f.parsed(fs)
	if !(*speed > 0 && *speed <= 1000) {
		return fmt.Errorf("demo: --speed must be above 0 and at most 1000, got %v", *speed)
	}
	if *interval < 50*time.Millisecond {
		return fmt.Errorf("demo: --interval must be at least 50ms, got %v", *interval)
	}
	names := splitList(f.regions)
	// The dashboard's port first: a taken one fails before etcd starts.
	if !f.devTLS.enabled() {
		// Plain text, as allot dev chooses it without TLS flags: loopback only.
		if err := (security{insecure: true}).plain("dashboard http", *dashAddr, tlsx.ListenRule); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	dl, err := net.Listen("tcp", *dashAddr)
	if err != nil {
		return fmt.Errorf("demo: dashboard listen: %w", err)
	}
	links := demo.NewLinks()
	defer links.Close()
	c, err := startDev(ctx, &f, stderr, func(region string, coordinators []string) ([]string, map[string]string, error) {
		var via []string
		for _, a := range coordinators {
			addr, err := links.Add(region, demo.Coordinator, a)
			if err != nil {
				return nil, nil, err
			}
			via = append(via, addr)
		}
		peers := map[string]string{}
		for _, p := range names {
			if p == region {
				continue
			}
			addr, err := links.Add(region, p, "") // its address is known once it listens
			if err != nil {
				return nil, nil, err
			}
			peers[p] = addr
		}
		return via, peers, nil
	})
	if err != nil {
		dl.Close()
		return err
	}
	defer c.close()
	client := c.sec // plain text
	if c.tls != nil {
		client = c.tls.security(holderDemo) // checks and reserves; reads the regions' Status and Usage (viewer)
	}
	regions := make([]demo.Region, len(c.nodes))
	for i, n := range c.nodes {
		links.SetTarget(n.name, n.grpcAddr)
		regions[i] = demo.Region{Name: n.name, Addr: n.grpcAddr}
	}

	story := demo.DefaultStory(names).Scaled(*speed)
	series := demo.NewSeries(names, story, *interval, 0)
	hs := httpx.Server(demo.Dashboard(series), httpTimeouts)
	go c.sec.serveHTTP(hs, dl)
	defer hs.Close()
	url := c.sec.scheme() + "://" + dl.Addr().String() + "/"
	printCluster(stdout, "allot demo", c)
	fmt.Fprintf(stdout, "  dashboard        %s\n", url)
	again := "; it starts over at the end"
	if *once {
		again = ""
	}
	fmt.Fprintf(stdout, "\nPlaying a story of %v (--speed %g)%s. Stop with Ctrl-C.\n\n", story.Total().Round(time.Second), *speed, again)

	// The story runs on ctx; the regions serve until it has returned,
	// so that its reservations are settled before they stop.
	dctx, stopDemo := context.WithCancel(ctx)
	defer stopDemo()
	sctx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	played := make(chan error, 1)
	go func() {
		played <- demo.Run(dctx, demo.Options{Story: story, Regions: regions, Links: links, Series: series,
			Out: stdout, ANSI: isTerminal(stdout), Header: "dashboard " + url, Interval: *interval, Once: *once,
			Seed: uint64(time.Now().UnixNano()), Logger: c.log, Credentials: client.creds()})
		stopServe()
	}()
	err = c.serve(sctx, f.config)
	stopDemo()
	if perr := <-played; perr != nil {
		return perr
	}
	return err
}

// isTerminal reports whether w is a terminal that takes ANSI sequences.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
