package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/internal/tlsx"
	"github.com/allot-dev/allot/regional"
)

// DefaultMaxBatch bounds the items of one Check call when Options.MaxBatch
// is 0.
const DefaultMaxBatch = 1000

// Options configure a Service.
type Options struct {
	Region string
	// Registry receives the service's metrics; nil exports none.
	Registry prometheus.Registerer
	// Logger receives request errors at debug level; nil discards.
	Logger *slog.Logger
	// Now reads the clock; nil means time.Now.
	Now func() time.Time
	// MaxBatch bounds the items of one Check call.
	MaxBatch int
	// Enforcer, when set, decides the domains that have leased or exact
	// limits with the regional store; its engine must be the Service's.
	// nil decides every limit in the engine, as local.
	Enforcer *regional.Enforcer
	// Reservations configure LLM token reservations (reserve.go); a nil
	// NewSketch learns estimates with DDSketch.
	Reservations regional.ReservationOptions
	// LeaseTTL is how long a gateway may spend a Lease grant before its
	// unused tokens must come back; 0 means DefaultLeaseTTL.
	LeaseTTL time.Duration
	// RLQS configures Envoy's rate limit quota service; its Registry
	// defaults to Registry.
	RLQS RLQSOptions
	// Authorization decides the roles of callers (authz.go): from their
	// certificates' identities, else its anonymous roles. nil gives every
	// caller every role, as before roles existed; the commands always set
	// one (--anonymous-roles, --grant-roles). Lease returns are bounded
	// by grants whatever it is.
	Authorization *tlsx.Policy
	// MaxLeaseGrants bounds the grants remembered so that their unused
	// tokens can come back (lease.go); 0 means DefaultMaxLeaseGrants.
	MaxLeaseGrants int
}

// Service serves one region's engine. The zero value is not usable; call
// New. Safe for concurrent use.
type Service struct {
	engine   *regional.Engine
	enforcer *regional.Enforcer // nil: no regional store
	region   string
	now      func() time.Time
	log      *slog.Logger
	maxBatch int
	metrics  *metrics
	rsv      *reserveState // reserve.go
	shadow   *shadowLog    // samples would-be rejections of shadow limits (shadowlog.go)
	leases   *leases       // gateway leases (lease.go)
	rlqs     *RLQS         // Envoy's rate limit quota service (rlqs.go)
	authz    *authz        // who may call what (authz.go)
}

// New returns a Service deciding with engine.
func New(engine *regional.Engine, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	s := &Service{
		engine:   engine,
		enforcer: opts.Enforcer,
		region:   opts.Region,
		now:      opts.Now,
		log:      opts.Logger.With("region", opts.Region),
		maxBatch: opts.MaxBatch,
	}
	s.metrics = newMetrics(engine, opts.Enforcer, opts.Region, opts.Registry)
	s.authz = newAuthz(opts.Authorization, opts.Registry)
	s.rsv = newReserveState(s, opts)
	s.shadow = newShadowLog(s.log, DefaultShadowLogRate)
	s.leases = newLeases(s, opts.LeaseTTL, opts.MaxLeaseGrants, opts.Registry)
	if opts.RLQS.Registry == nil {
		opts.RLQS.Registry = opts.Registry
	}
	s.rlqs = NewRLQS(s, opts.RLQS)
	return s
}

// Engine returns the engine the service decides with.
func (s *Service) Engine() *regional.Engine { return s.engine }

// SetConfig replaces the engine's configuration (a reload).
func (s *Service) SetConfig(cfg *allot.Config) {
	s.engine.Reconfigure(s.now(), cfg)
	s.metrics.configLoaded(cfg)
}

// CheckItem is one request to decide, as every front end receives it.
type CheckItem struct {
	Domain      string
	Descriptors []allot.Descriptor
	Hits        int64
}

// checkItems decides a request in the Enforcer when there is one (it
// sends domains without leased or exact limits to the engine), else in
// the engine.
func (s *Service) checkItems(ctx context.Context, now time.Time, domain string, items []regional.Item, dec *allot.Decision) error {
	if s.enforcer != nil {
		return s.enforcer.CheckItems(ctx, now, domain, items, dec)
	}
	return s.engine.CheckItems(now, domain, items, dec)
}

// refundItems gives hits back where checkItems charged them.
func (s *Service) refundItems(ctx context.Context, now time.Time, domain string, items []regional.Item, dec *allot.Decision) error {
	if s.enforcer != nil {
		return s.enforcer.RefundItems(ctx, now, domain, items, dec)
	}
	return s.engine.RefundItems(now, domain, items, dec)
}

// checkBatch validates every item, then decides them in order. A batch
// with any bad item fails as a whole, before anything is charged.
func (s *Service) checkBatch(ctx context.Context, items []CheckItem, decs []allot.Decision) error {
	if len(items) == 0 {
		return fmt.Errorf("%w: no items", ErrBadRequest)
	}
	if len(items) > s.maxBatch {
		return fmt.Errorf("%w: %d items, at most %d", ErrBadRequest, len(items), s.maxBatch)
	}
	now := s.now()
	for i, it := range items {
		if err := s.validate(now, it, len(items) > 1); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
	}
	for i, it := range items {
		if err := s.decide(ctx, now, it, &decs[i]); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
	}
	return nil
}

// validate refuses a malformed item. With deep, it also asks the engine,
// so that a batch fails before any of its items is charged; a single item
// is validated by the engine as it is decided.
func (s *Service) validate(now time.Time, it CheckItem, deep bool) error {
	if err := checkItem(it); err != nil || !deep {
		return err
	}
	return s.engine.Validate(now, it.Domain, engineItems(it, make([]regional.Item, 0, len(it.Descriptors))))
}

func checkItem(it CheckItem) error {
	if it.Domain == "" {
		return fmt.Errorf("%w: empty domain", ErrBadRequest)
	}
	if len(it.Descriptors) == 0 {
		return fmt.Errorf("%w: no descriptors", ErrBadRequest)
	}
	if len(it.Descriptors) > regional.MaxItems {
		return fmt.Errorf("%w: %d descriptors, at most %d", ErrBadRequest, len(it.Descriptors), regional.MaxItems)
	}
	for j, d := range it.Descriptors {
		if len(d) == 0 {
			return fmt.Errorf("%w: descriptor %d is empty", ErrBadRequest, j)
		}
	}
	if it.Hits < 0 || it.Hits > allot.MaxAmount {
		return fmt.Errorf("%w: hits %d is outside [0, %d]", regional.ErrBadCost, it.Hits, int64(allot.MaxAmount))
	}
	return nil
}

// decide decides one item and records it.
func (s *Service) decide(ctx context.Context, now time.Time, it CheckItem, dec *allot.Decision) error {
	var inline [4]regional.Item
	items := engineItems(it, inline[:0])
	start := time.Now()
	err := s.checkItems(ctx, now, it.Domain, items, dec)
	s.metrics.record(it.Domain, dec, err, time.Since(start))
	if err == nil {
		s.shadow.observe(now, it, dec)
	}
	if err != nil {
		s.log.Debug("check refused", "domain", it.Domain, "err", err)
	}
	return err
}

// engineItems appends the engine's items for it to dst.
func engineItems(it CheckItem, dst []regional.Item) []regional.Item {
	for _, d := range it.Descriptors {
		dst = append(dst, regional.Item{Descriptor: d, Hits: it.Hits})
	}
	return dst
}
