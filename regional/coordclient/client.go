// Package coordclient is a regional enforcer's link to the coordinators:
// it reports the engine's demand, applies the assignments it receives
// (lowerings first, through coordinator.Applier) and acknowledges them.
// It never blocks a decision: the engine keeps enforcing its current
// shares whatever happens to the link.
//
// On start it applies the latest assignment persisted in etcd, when a
// snapshot source is given, or else the initial split
// (coordinator.InitialShares); then it keeps one Connect stream per domain
// to whichever coordinator leads it, reconnecting with backoff.
package coordclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/wire"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// Options configure a Client.
type Options struct {
	Region string
	Engine *regional.Engine
	// Addrs are the coordinators' gRPC addresses; the client tries them in
	// turn until one leads the domain.
	Addrs []string
	// Snapshot reads a domain's persisted assignments (from etcd); nil
	// starts from the initial split.
	Snapshot func(ctx context.Context, domain string) (coordinator.Snapshot, error)
	// ReportEvery is the report interval (default 1s).
	ReportEvery time.Duration
	Logger      *slog.Logger
	Registry    prometheus.Registerer
	Now         func() time.Time
}

// Client links one region to the coordinators. Safe for concurrent use.
type Client struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics
	conns   []*grpc.ClientConn

	mu      sync.Mutex
	domains map[string]*link
}

// link is one domain's state.
type link struct {
	domain  string
	applier *coordinator.Applier // guarded by mu
	mu      sync.Mutex
	reports chan coordinator.Report
}

// New returns a Client; Run starts it.
func New(opts Options) (*Client, error) {
	if opts.Engine == nil || opts.Region == "" || len(opts.Addrs) == 0 {
		return nil, errors.New("coordclient: Engine, Region and Addrs are required")
	}
	if opts.ReportEvery <= 0 {
		opts.ReportEvery = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Client{opts: opts, log: opts.Logger.With("region", opts.Region), metrics: newMetrics(opts.Registry), domains: map[string]*link{}}
	for _, a := range opts.Addrs {
		// A coordinator back from a partition or a restart is redialled
		// within a second, not gRPC's default of up to two minutes.
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: time.Second,
			}))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("coordclient: %s: %w", a, err)
		}
		c.conns = append(c.conns, cc)
	}
	return c, nil
}

// Close closes the connections.
func (c *Client) Close() {
	for _, cc := range c.conns {
		cc.Close()
	}
}

// Start applies, for every domain of the engine's configuration that
// lists this region, the persisted assignment (or the initial split) to
// the engine. Call it before the region serves traffic, then Run.
func (c *Client) Start(ctx context.Context) error {
	// A limit that a later configuration adds starts at this region's
	// initial split, not at the whole limit, until it is assigned.
	c.opts.Engine.SetInitialShare(func(d *allot.Domain, l *allot.Limit) float64 {
		i := slices.Index(d.Regions, c.opts.Region)
		if i < 0 {
			return 1 // a domain this region enforces alone
		}
		return coordinator.InitialShares(l.Floors, d.Regions)[i]
	})
	for _, d := range c.opts.Engine.Config().Domains {
		if slices.Contains(d.Regions, c.opts.Region) {
			if _, err := c.start(ctx, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// Reconfigure follows a new configuration of the engine: every linked
// domain's Applier is rebuilt from the latest persisted assignment, so
// that assignments of limits the configuration added are accepted. Call
// it after the engine's SetConfig. A domain added to the configuration is
// linked at the next start.
func (c *Client) Reconfigure(ctx context.Context) error {
	var errs []error
	for _, d := range c.opts.Engine.Config().Domains {
		c.mu.Lock()
		l := c.domains[d.Name]
		c.mu.Unlock()
		if l == nil {
			continue
		}
		app, err := c.applier(ctx, d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		l.mu.Lock()
		l.applier = app
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Run keeps the started domains linked to their coordinators until ctx
// ends.
func (c *Client) Run(ctx context.Context) error {
	c.mu.Lock()
	links := slices.Collect(maps.Values(c.domains))
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range links {
		wg.Go(func() { c.stream(ctx, l) })
	}
	wg.Go(func() { c.report(ctx) })
	wg.Wait()
	return ctx.Err()
}

// start applies the domain's persisted (or initial) shares to the engine.
func (c *Client) start(ctx context.Context, d *allot.Domain) (*link, error) {
	app, err := c.applier(ctx, d)
	if err != nil {
		return nil, err
	}
	l := &link{domain: d.Name, applier: app, reports: make(chan coordinator.Report, 1)}
	c.mu.Lock()
	c.domains[d.Name] = l
	c.mu.Unlock()
	return l, nil
}

// applier reads the domain's persisted assignment (or none), applies its
// shares to the engine and returns the Applier that continues from it.
func (c *Client) applier(ctx context.Context, d *allot.Domain) (*coordinator.Applier, error) {
	var snap coordinator.Snapshot
	if c.opts.Snapshot != nil {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		s, err := c.opts.Snapshot(sctx, d.Name)
		cancel()
		if err != nil {
			// Starting from the initial split could take back share the
			// coordinator gave to others: refuse rather than guess.
			return nil, fmt.Errorf("coordclient: read the assignments of %s: %w", d.Name, err)
		}
		snap = s
	}
	app, err := coordinator.NewApplier(d, c.opts.Region, snap)
	if err != nil {
		return nil, err
	}
	now := c.opts.Now()
	for _, l := range d.Limits {
		if err := c.opts.Engine.SetShare(now, d.Name, l.Name, app.Share(l.Name, "")); err != nil {
			return nil, err
		}
	}
	for _, rec := range snap.Records {
		if rec.Key != "" && rec.Cells != nil {
			c.setShare(now, d.Name, coordinator.Share{Limit: rec.Limit, Key: rec.Key, Value: app.Share(rec.Limit, rec.Key)})
		}
	}
	c.log.Info("shares applied from the persisted assignment", "domain", d.Name, "term", snap.Term, "version", snap.Version)
	return app, nil
}

func (c *Client) setShare(now time.Time, domain string, s coordinator.Share) {
	var err error
	if s.Key == "" {
		err = c.opts.Engine.SetShare(now, domain, s.Limit, s.Value)
	} else {
		err = c.opts.Engine.SetKeyShare(now, domain, s.Limit, s.Key, s.Value)
	}
	if err != nil {
		c.log.Warn("share not applied", "domain", domain, "limit", s.Limit, "key", s.Key, "err", err)
	}
}

// report drains the engine's demand every interval and hands each domain
// its report; a report that cannot be sent is dropped (demand is a rate).
func (c *Client) report(ctx context.Context) {
	t := time.NewTicker(c.opts.ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := c.opts.Now()
		byDomain := map[string]*coordinator.Report{}
		for _, d := range c.opts.Engine.Demand() {
			r := byDomain[d.Domain]
			if r == nil {
				r = &coordinator.Report{Domain: d.Domain, Region: c.opts.Region, At: now}
				byDomain[d.Domain] = r
			}
			if n := len(r.Limits); n == 0 || r.Limits[n-1].Limit != d.Limit {
				r.Limits = append(r.Limits, coordinator.LimitDemand{Limit: d.Limit})
			}
			ld := &r.Limits[len(r.Limits)-1]
			if d.Key == "" {
				ld.Admitted, ld.Rejected = d.Admitted, d.Rejected
			} else {
				ld.Keys = append(ld.Keys, coordinator.KeyDemand{Key: d.Key, Admitted: d.Admitted, Rejected: d.Rejected, NearLimit: d.NearLimit})
			}
		}
		c.mu.Lock()
		for name, l := range c.domains {
			r := byDomain[name]
			if r == nil {
				r = &coordinator.Report{Domain: name, Region: c.opts.Region, At: now} // an empty report says "alive"
			}
			select {
			case <-l.reports: // drop the unsent older one
			default:
			}
			l.reports <- *r
		}
		c.mu.Unlock()
	}
}

// stream keeps the domain's Connect stream up, with backoff.
func (c *Client) stream(ctx context.Context, l *link) {
	backoff := 100 * time.Millisecond
	for i := 0; ctx.Err() == nil; i++ {
		cc := c.conns[i%len(c.conns)]
		err := c.session(ctx, cc, l)
		c.metrics.connected(l.domain, false)
		if ctx.Err() != nil {
			return
		}
		c.log.Debug("coordinator stream ended", "domain", l.domain, "target", cc.Target(), "err", err)
		if i%len(c.conns) == len(c.conns)-1 { // every address tried: wait
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
		}
		if err == nil {
			backoff = 100 * time.Millisecond
		}
	}
}

// session runs one stream until it fails; it returns nil if the stream
// was up and applied at least one assignment.
func (c *Client) session(ctx context.Context, cc *grpc.ClientConn, l *link) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := allotv1.NewCoordinatorClient(cc).Connect(sctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	term, version := l.applier.Applied()
	l.mu.Unlock()
	hello := &allotv1.Hello{Domain: l.domain, Region: c.opts.Region, Term: term, Version: version}
	if err := st.Send(&allotv1.RegionMessage{Msg: &allotv1.RegionMessage_Hello{Hello: hello}}); err != nil {
		return err
	}
	c.metrics.connected(l.domain, true)
	acks := make(chan coordinator.Ack, 16)
	errc := make(chan error, 2)
	applied := false
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			if rj := m.GetRejection(); rj != nil {
				c.log.Warn("coordinator refused a message", "domain", l.domain, "reason", rj.GetMessage())
				continue
			}
			if a := m.GetAssignment(); a != nil {
				if ack, ok := c.apply(l, a); ok {
					applied = true
					select {
					case acks <- ack:
					default:
					}
				}
			}
		}
	}()
	for {
		var msg *allotv1.RegionMessage
		select {
		case err := <-errc:
			if applied && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "leadership")) {
				return nil
			}
			return err
		case r := <-l.reports:
			msg = wire.Report(r)
		case a := <-acks:
			msg = wire.Ack(a)
		}
		if err := st.Send(msg); err != nil {
			return err
		}
	}
}

// apply applies one assignment to the engine, lowerings first.
func (c *Client) apply(l *link, pa *allotv1.ShareAssignment) (coordinator.Ack, bool) {
	a := wire.FromAssignment(pa)
	l.mu.Lock()
	defer l.mu.Unlock()
	shares, ack, err := l.applier.Apply(a)
	if err != nil {
		c.metrics.refused(l.domain)
		c.log.Debug("assignment not applied", "domain", l.domain, "term", a.Term, "version", a.Version, "err", err)
		return coordinator.Ack{}, false
	}
	now := c.opts.Now()
	for _, s := range shares {
		c.setShare(now, l.domain, s)
	}
	c.metrics.applied(l.domain, a.Term, a.Version, now)
	return ack, true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
