package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Defaults of Config.
const (
	DefaultSyncInterval = 250 * time.Millisecond
	DefaultTimeout      = 100 * time.Millisecond
)

// Errors the Client returns, in Decision.Err or from its methods.
var (
	// ErrBadRequest: the request was malformed; nothing was charged.
	ErrBadRequest = errors.New("client: bad request")
	// ErrUnavailable: no enforcer answered; on_failure decided.
	ErrUnavailable = errors.New("client: no enforcer answered")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("client: closed")
)

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are the gRPC addresses of the region's enforcers. The Client
	// sends to one at a time and fails over to the next when it does not
	// answer; a background probe brings it back.
	Addrs []string
	// SyncInterval is how often the Client sends its one batched Lease
	// call: usage, returns of ended leases and new leases for every key
	// it holds. 0 means DefaultSyncInterval.
	SyncInterval time.Duration
	// Timeout bounds each call to an enforcer. 0 means DefaultTimeout.
	Timeout time.Duration
	// GatewayID names this process to the enforcers, which count gateways
	// by it; empty means a random id.
	GatewayID string
	// TLS, when set, makes the connections TLS with it: RootCAs verify
	// the enforcers, and a client certificate (Certificates, or
	// GetClientCertificate to pick up a rotated one) names this gateway.
	// TLSFromEnv builds one from ALLOT_TLS_* files (its CA bundle fixed;
	// CredentialsFromEnv, in DialOptions, follows a rotated one). nil:
	// plain text, unless DialOptions hold transport credentials.
	TLS *tls.Config
	// DialOptions are added to the connections' options, after TLS's
	// credentials (so transport credentials here take precedence);
	// without any, and without TLS, the connections are insecure
	// (loopback, or a mesh that encrypts).
	DialOptions []grpc.DialOption
	// UnknownOnFailure decides a request when no enforcer has ever
	// answered for its shape, so its limits' own policies are not known:
	// allot.FailOpen (the zero value here means open), or allot.FailClosed.
	UnknownOnFailure allot.FailurePolicy
	// Logger receives failovers and sync errors; nil discards.
	Logger *slog.Logger
}

// Client decides requests inside a gateway. Keys whose limits allow it
// are decided in memory from leases the enforcer granted; the others go
// to the enforcer, batched with concurrent calls. Safe for concurrent use;
// call Close to return unused tokens.
type Client struct {
	cfg       Config
	log       *slog.Logger
	endpoints []*endpoint
	cur       atomic.Int32 // index of the endpoint in use
	keys      keyTable     // allow.go
	checks    *batcher[*allotv1.CheckItem, checkAnswer]
	gateways  atomic.Int32 // the enforcer's count of gateways, ≥ 1
	leaseTTL  atomic.Int64 // the enforcer's lease TTL, ns
	sticky    sync.Map     // reservation id → *endpoint
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closed    atomic.Bool
	lastSent  time.Time // the last Lease round; used by the sync loop only
	stats     stats
}

// endpoint is one enforcer.
type endpoint struct {
	addr    string
	cc      *grpc.ClientConn
	rl      allotv1.RateLimiterClient
	healthy atomic.Bool
}

// New connects to the enforcers in cfg.Addrs (connections are made
// lazily; New does not wait for them) and starts the sync loop.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("%w: no enforcer addresses", ErrBadRequest)
	}
	if cfg.SyncInterval <= 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.GatewayID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.GatewayID = "gw-" + hex.EncodeToString(b[:])
	}
	if cfg.UnknownOnFailure != allot.FailClosed {
		cfg.UnknownOnFailure = allot.FailOpen
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Client{
		cfg:  cfg,
		log:  cfg.Logger.With("gateway", cfg.GatewayID),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	// An enforcer back from a restart is redialled within a second, not
	// gRPC's default of up to two minutes.
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	}, cfg.DialOptions...)
	for _, addr := range cfg.Addrs {
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("enforcer %s: %w", addr, err)
		}
		ep := &endpoint{addr: addr, cc: cc, rl: allotv1.NewRateLimiterClient(cc)}
		ep.healthy.Store(true)
		c.endpoints = append(c.endpoints, ep)
	}
	c.gateways.Store(1)
	c.keys.init()
	c.checks = newBatcher(maxBatch, c.sendChecks)
	go c.run()
	return c, nil
}

// maxBatch bounds the items of one Check or Lease call (the enforcer's
// default bound).
const maxBatch = 1000

func (c *Client) closeConns() {
	for _, ep := range c.endpoints {
		_ = ep.cc.Close()
	}
}

// Close stops the sync loop, returns every lease's unused tokens in one
// last call (within ctx's deadline, or Timeout), tells the enforcer this
// gateway is leaving, and closes the connections. Later calls decide
// nothing: Allow returns ErrClosed.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.stop)
	<-c.done
	err := c.syncOnce(true)
	c.closeConns()
	return err
}

// call runs f against the endpoint in use, failing over to the others in
// turn when it does not answer. Errors that are the request's own (bad
// input, unknown domain) are returned at once.
func (c *Client) call(ctx context.Context, f func(context.Context, *endpoint) error) (*endpoint, error) {
	n := len(c.endpoints)
	start := int(c.cur.Load())
	var last error
	for i := range n {
		ep := c.endpoints[(start+i)%n]
		if !ep.healthy.Load() && i < n-1 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		err := f(cctx, ep)
		cancel()
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			if err == nil && !ep.healthy.Load() {
				ep.healthy.Store(true)
			}
			return ep, err
		}
		last = err
		if ep.healthy.Swap(false) {
			c.log.Warn("enforcer not answering, failing over", "addr", ep.addr, "err", err)
			c.stats.failovers.Add(1)
		}
		c.cur.Store(int32((start + i + 1) % n))
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, last)
}

// unreachable reports whether err means the enforcer did not answer, as
// opposed to answering with an error about the request.
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// probe tries the endpoints marked down with an empty Lease call and marks
// those that answer as healthy again; the first healthy endpoint in
// Addrs order becomes the one in use.
func (c *Client) probe() {
	for i, ep := range c.endpoints {
		if !ep.healthy.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
			_, err := ep.rl.Lease(ctx, &allotv1.LeaseRequest{GatewayId: c.cfg.GatewayID})
			cancel()
			if err == nil {
				ep.healthy.Store(true)
				c.log.Info("enforcer answering again", "addr", ep.addr)
			}
		}
		if ep.healthy.Load() {
			c.cur.Store(int32(i))
			return
		}
	}
}

// Stats are a Client's counters.
type Stats struct {
	Decisions       int64 // Allow calls answered (bad input aside)
	LocalDecided    int64 // decided in memory, without a call
	EnforcerDecided int64 // decided by an enforcer's Check
	CheckRPCs       int64 // Check calls sent (each may carry many requests)
	LeaseRPCs       int64 // Lease calls sent
	FallbackDecided int64 // decided by on_failure
	Failovers       int64 // times an enforcer stopped answering
	Keys            int64 // request shapes held
}

type stats struct {
	local, remote, checkRPCs, leaseRPCs, fallback, failovers atomic.Int64
}

// Stats returns the Client's counters.
func (c *Client) Stats() Stats {
	return Stats{
		Decisions:       c.stats.local.Load() + c.stats.remote.Load() + c.stats.fallback.Load(),
		LocalDecided:    c.stats.local.Load(),
		EnforcerDecided: c.stats.remote.Load(),
		CheckRPCs:       c.stats.checkRPCs.Load(),
		LeaseRPCs:       c.stats.leaseRPCs.Load(),
		FallbackDecided: c.stats.fallback.Load(),
		Failovers:       c.stats.failovers.Load(),
		Keys:            int64(c.keys.len()),
	}
}

// Gateways is the number of gateways the enforcer last counted in the
// region, this one included.
func (c *Client) Gateways() int { return int(c.gateways.Load()) }
