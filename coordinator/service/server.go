package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/etcdstore"
	"github.com/allot-dev/allot/coordinator/wire"
	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Options configure a Server.
type Options struct {
	Store *etcdstore.Store
	// Config holds the domains; Domains selects those to coordinate
	// (default: every domain of Config).
	Config  *allot.Config
	Domains []string
	// Advertise is the gRPC address regions reach this server at; it is
	// the value of the election key, so followers can name the leader.
	Advertise string
	// Coordinator is the template of every domain's coordinator.Config
	// (Domain and Term are filled in).
	Coordinator coordinator.Config
	// GrantTTL and MaxSkew configure every domain's coordinator.Fleet:
	// how long an instance's grant lasts unrenewed, and the clock skew
	// tolerated between this server and the instances (0: defaults).
	GrantTTL time.Duration
	MaxSkew  time.Duration
	// TickEvery is how often the driver ticks the coordinator (default
	// 100ms; it rebalances every Coordinator.Period).
	TickEvery time.Duration
	Logger    *slog.Logger
	Registry  prometheus.Registerer
	Now       func() time.Time
}

// Server serves allot.v1.Coordinator. Safe for concurrent use.
type Server struct {
	allotv1.UnimplementedCoordinatorServer
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	cfg     *allot.Config      // the configuration in force (SetConfig replaces it)
	leading map[string]*driver // domain → its driver, while this server leads it
	// reloaded holds the Fleet of a domain whose driver stopped for a new
	// configuration, which the next term continues (the instances it knew
	// are all there is: no quiet period).
	reloaded map[string]*coordinator.Fleet
}

// errReload stops a driver so that it starts again with a new configuration.
var errReload = errors.New("service: configuration changed")

// New checks opts and returns a Server; Run makes it campaign.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Config == nil {
		return nil, errors.New("service: Store and Config are required")
	}
	if len(opts.Domains) == 0 {
		for _, d := range opts.Config.Domains {
			opts.Domains = append(opts.Domains, d.Name)
		}
	}
	if err := checkDomains(opts.Config, opts.Domains); err != nil {
		return nil, err
	}
	if opts.TickEvery <= 0 {
		opts.TickEvery = 100 * time.Millisecond
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Server{
		opts:    opts,
		log:     opts.Logger,
		metrics: newMetrics(opts.Registry),
		cfg:     opts.Config,
		leading: make(map[string]*driver), reloaded: make(map[string]*coordinator.Fleet),
	}, nil
}

func checkDomains(cfg *allot.Config, domains []string) error {
	for _, name := range domains {
		d := cfg.Domain(name)
		if d == nil {
			return fmt.Errorf("service: unknown domain %q", name)
		}
		if len(d.Regions) == 0 {
			return fmt.Errorf("service: domain %q declares no regions to coordinate", name)
		}
	}
	return nil
}

// SetConfig replaces the configuration. Every domain this server leads
// steps down and campaigns again, so that its next term starts from the
// persisted assignments with the new limits. A configuration that lacks a
// coordinated domain is refused and the old one stays.
func (s *Server) SetConfig(cfg *allot.Config) error {
	if err := checkDomains(cfg, s.opts.Domains); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cfg
	for _, d := range s.leading {
		d.reloadOnce.Do(func() { close(d.reload) })
	}
	return nil
}

func (s *Server) config() *allot.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// Register registers the Coordinator service on gs.
func (s *Server) Register(gs grpc.ServiceRegistrar) { allotv1.RegisterCoordinatorServer(gs, s) }

// Run campaigns for every domain until ctx ends, leading those it wins.
func (s *Server) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, name := range s.opts.Domains {
		wg.Go(func() { s.campaign(ctx, name) })
	}
	wg.Wait()
	return ctx.Err()
}

// Leading reports whether the server leads domain now.
func (s *Server) Leading(domain string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leading[domain] != nil
}

func (s *Server) campaign(ctx context.Context, domain string) {
	log := s.log.With("domain", domain)
	for ctx.Err() == nil {
		lead, err := s.opts.Store.Campaign(ctx, domain, s.opts.Advertise)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("campaign failed; retrying", "err", err)
				sleep(ctx, time.Second)
			}
			continue
		}
		// A new configuration takes a new term: the coordinator starts
		// from what this term persisted, which only a later term may.
		switch err := s.lead(ctx, domain, lead); {
		case errors.Is(err, errReload):
			log.Info("configuration changed; campaigning again to lead with it")
		case err != nil && ctx.Err() == nil:
			log.Warn("stepped down", "err", err)
		}
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		lead.Resign(rctx)
		cancel()
	}
}

// lead drives domain while lead holds.
func (s *Server) lead(ctx context.Context, domain string, lead *etcdstore.Leadership) error {
	snap, err := s.opts.Store.Snapshot(ctx, domain)
	if err != nil {
		return fmt.Errorf("read assignments: %w", err)
	}
	cfg := s.opts.Coordinator
	cfg.Domain, cfg.Term = s.config().Domain(domain), lead.Term
	s.mu.Lock()
	prev := s.reloaded[domain]
	delete(s.reloaded, domain)
	s.mu.Unlock()
	fleet, err := coordinator.NewFleet(s.opts.Now(), coordinator.FleetConfig{Coordinator: cfg, GrantTTL: s.opts.GrantTTL, MaxSkew: s.opts.MaxSkew}, snap, prev)
	if err != nil {
		return err
	}
	d := &driver{
		s: s, domain: domain, lead: lead, fleet: fleet,
		inbox:   make(chan inbound, 1024),
		reload:  make(chan struct{}),
		streams: make(map[streamID]*regionStream),
		done:    make(chan struct{}),
	}
	s.mu.Lock()
	s.leading[domain] = d
	s.mu.Unlock()
	s.metrics.leader(domain, true)
	s.log.Info("leading", "domain", domain, "term", lead.Term, "version", snap.Version, "records", len(snap.Records))
	defer func() {
		s.mu.Lock()
		delete(s.leading, domain)
		s.mu.Unlock()
		s.metrics.leader(domain, false)
		close(d.done)
	}()
	err = d.run(ctx)
	if errors.Is(err, errReload) {
		s.mu.Lock()
		s.reloaded[domain] = d.fleet // run has returned: the Fleet is no longer used
		s.mu.Unlock()
	}
	return err
}

func (s *Server) driverOf(domain string) *driver {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leading[domain]
}

// Connect serves one region's stream for one domain.
func (s *Server) Connect(stream allotv1.Coordinator_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message of a stream must be a hello")
	}
	// Over TLS the stream speaks for the instance its certificate names:
	// the hello, and every later message, must name it (so that one
	// instance cannot report or ack for another). In plain text (loopback
	// only) there is nothing to check against.
	id, secured, err := tlsx.Caller(stream.Context())
	if err == nil && secured {
		err = id.SpeaksFor(hello.GetRegion(), hello.GetInstance())
	}
	if err != nil {
		return s.refuseIdentity(hello.GetDomain(), err)
	}
	d := s.driverOf(hello.GetDomain())
	if d == nil {
		return s.notLeader(stream.Context(), hello.GetDomain())
	}
	// A region the configuration no longer lists may still say that its
	// instance left (the Fleet frees what it held, or refuses it).
	if !slices.Contains(s.config().Domain(d.domain).Regions, hello.GetRegion()) && !hello.GetLeaving() {
		s.metrics.rejected(hello.GetDomain(), "unknown_region")
		return status.Errorf(codes.InvalidArgument, "region %q is not a region of domain %q", hello.GetRegion(), hello.GetDomain())
	}
	// Each instance of a region has a stream of its own; the Hello's
	// assignment and grant, if any, count as acked by this instance.
	rs := d.attach(hello.GetRegion(), hello.GetInstance(),
		coordinator.Ack{Term: hello.GetTerm(), Version: hello.GetVersion(), Seq: hello.GetGrantSeq(), Leaving: hello.GetLeaving(), SentAt: wire.HelloSentAt(hello)}, wire.FromWeights(hello.GetWeights()))
	defer d.detach(rs)
	errc := make(chan error, 2)
	go func() {
		for {
			select {
			case m := <-rs.out:
				if err := stream.Send(m); err != nil {
					errc <- err
					return
				}
			case <-rs.closed:
				errc <- status.Errorf(codes.Unavailable, "leadership of domain %q moved; reconnect", d.domain)
				return
			case <-rs.kicked:
				errc <- status.Errorf(codes.Unavailable, "too slow to take a full grant of domain %q; reconnect", d.domain)
				return
			case <-stream.Context().Done():
				return
			}
		}
	}()
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if secured {
				if err := laterIdentity(id, m); err != nil {
					errc <- s.refuseIdentity(d.domain, err)
					return
				}
			}
			msg, err := wire.FromRegion(d.domain, rs.region, m)
			if err != nil {
				s.metrics.rejected(d.domain, "malformed")
				rs.reject(err)
				continue
			}
			d.post(rs, msg)
		}
	}()
	err = <-errc
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// refuseIdentity counts a stream refused because its caller's certificate
// does not name who its messages say, and returns its status.
func (s *Server) refuseIdentity(domain string, err error) error {
	if !slices.Contains(s.opts.Domains, domain) {
		domain = "" // a label of the configuration's domains only
	}
	s.metrics.rejected(domain, "identity")
	s.log.Debug("stream refused", "domain", domain, "reason", "identity", "err", err)
	return status.Error(codes.PermissionDenied, err.Error())
}

// laterIdentity checks a message after the hello of a stream over TLS
// against the caller's identity: a hello must name its region and
// instance, a report or an ack its region (they name no instance: they
// count for the stream's).
func laterIdentity(id tlsx.Identity, m *allotv1.RegionMessage) error {
	switch {
	case m.GetHello() != nil:
		return id.SpeaksFor(m.GetHello().GetRegion(), m.GetHello().GetInstance())
	case m.GetReport() != nil:
		return id.SpeaksFor(m.GetReport().GetRegion(), id.Instance)
	case m.GetAck() != nil:
		return id.SpeaksFor(m.GetAck().GetRegion(), id.Instance)
	}
	return nil
}

func (s *Server) notLeader(ctx context.Context, domain string) error {
	if !slices.Contains(s.opts.Domains, domain) {
		return status.Errorf(codes.NotFound, "this coordinator does not coordinate domain %q", domain)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	leader, err := s.opts.Store.Leader(lctx, domain)
	if err != nil || leader == "" {
		return status.Errorf(codes.Unavailable, "not the leader of domain %q; no leader known yet", domain)
	}
	return status.Errorf(codes.Unavailable, "not the leader of domain %q; leader: %s", domain, leader)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
