// Package coordclient is a regional enforcer instance's link to the
// coordinators: it reports the engine's demand, applies the assignments
// and grants it receives (lowerings first, through coordinator.Instance)
// and acknowledges them. It never blocks a decision: the engine keeps
// enforcing what the instance holds whatever happens to the link.
//
// An instance names itself (Options.Instance, or an id made at start, so
// a restarted process is a new instance). It starts holding nothing of a
// coordinated domain: every share is 0 until the coordinator's first full
// grant (Ready says when every domain has one), and a grant not renewed
// before it expires takes the instance back to nothing. It keeps one
// Connect stream per domain to whichever coordinator leads it,
// reconnecting with backoff.
package coordclient

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/coordinator/wire"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
)

// Options configure a Client.
type Options struct {
	Region string
	// Instance names this instance to the coordinator; it must be unique
	// in the region and is kept across reconnects. Empty: the host name and
	// a random suffix, new at every start.
	Instance string
	Engine   *regional.Engine
	// Node is the instance's core (its engine, region and instance name
	// it); nil: one made from Engine, Region and Instance. The peer syncer
	// of the same process shares it.
	Node *node.Node
	// Addrs are the coordinators' gRPC addresses; the client tries them in
	// turn until one leads the domain.
	Addrs []string
	// ReportEvery is the report interval (default 1s).
	ReportEvery time.Duration
	// Credentials secure the connections to the coordinators (TLS with
	// this instance's client certificate: the Coordinator service
	// requires one when it runs TLS); nil means plain text.
	Credentials credentials.TransportCredentials
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

	node *node.Node

	mu      sync.Mutex
	domains map[string]*link
}

// link is one domain's stream state.
type link struct {
	domain  string
	reports chan coordinator.Report
	renewed chan struct{}        // a grant with a new expiry was applied
	leave   chan coordinator.Ack // Leave's ack, for the stream to send
	left    chan struct{}        // closed once it was taken (leftOnce)
	leftOne sync.Once
	resync  chan struct{} // the stream must start again (node.Node.Behind)
}

// New returns a Client; Run starts it.
func New(opts Options) (*Client, error) {
	if opts.Node != nil {
		opts.Engine, opts.Region, opts.Instance = opts.Node.Engine(), opts.Node.Region(), opts.Node.Instance()
	}
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
	if opts.Instance == "" {
		opts.Instance = NewInstanceID()
	}
	n := opts.Node
	if n == nil {
		var err error
		if n, err = node.New(node.Options{Region: opts.Region, Instance: opts.Instance, Engine: opts.Engine}); err != nil {
			return nil, err
		}
	}
	c := &Client{opts: opts, node: n, log: opts.Logger.With("instance", opts.Instance), metrics: newMetrics(opts.Registry), domains: map[string]*link{}}
	for _, a := range opts.Addrs {
		// A coordinator back from a partition or a restart is redialled
		// within a second, not gRPC's default of up to two minutes.
		creds := opts.Credentials
		if creds == nil {
			creds = insecure.NewCredentials()
		}
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(creds),
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

// NewInstanceID returns an instance id: the host name and a random
// suffix.
func NewInstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%x", cmp.Or(host, "instance"), b)
}

// Instance returns the id this instance has at the coordinator.
func (c *Client) Instance() string { return c.opts.Instance }

// Start makes every domain of the engine's configuration that lists this
// region coordinated: the instance holds nothing of it until the
// coordinator grants it a part (node.Node.Link). Call it before the
// region serves traffic, then Run.
func (c *Client) Start(ctx context.Context) error {
	if err := c.node.Link(c.opts.Now()); err != nil {
		return err
	}
	for _, d := range c.node.Domains() {
		l := &link{domain: d, reports: make(chan coordinator.Report, 1), renewed: make(chan struct{}, 1),
			leave: make(chan coordinator.Ack, 1), left: make(chan struct{}), resync: make(chan struct{}, 1)}
		c.mu.Lock()
		c.domains[d] = l
		c.mu.Unlock()
	}
	return nil
}

// Ready returns nil once every linked domain holds a grant with a part of
// each of its local limits, or an error that names the first domain that
// does not: an instance that holds nothing rejects every request of it.
func (c *Client) Ready() error { return c.node.Ready() }

// Leave drops every share of every linked domain to nothing for good and
// tells the coordinators so, waiting until ctx ends at most: what this
// instance held is then reclaimable at once instead of after its grants
// expire. A leave counts as told once the stream that carried it stayed
// up for leaveLinger; one that broke sooner (leadership moved as it was
// sent) is told again by the next stream's hello, which a new leader
// takes even for a region its configuration no longer lists. Call it on
// a graceful stop, once no request is served any more, before Run's
// context ends.
func (c *Client) Leave(ctx context.Context) {
	c.mu.Lock()
	links := slices.Collect(maps.Values(c.domains))
	c.mu.Unlock()
	acks := c.node.Leave(c.opts.Now())
	for _, l := range links {
		select {
		case l.leave <- acks[l.domain]:
		default:
		}
	}
	for _, l := range links {
		select {
		case <-l.left:
		case <-ctx.Done():
			return
		}
	}
}

// Reconfigure follows a new configuration of the engine: limits it adds
// are held at nothing until assigned, and the domain's stream starts
// again, so that the full grant of the new one brings their shares. Call
// it after the engine's Reconfigure. A domain added to the configuration
// is linked at the next start.
func (c *Client) Reconfigure(ctx context.Context) error {
	err := c.node.Reconfigure(c.opts.Now())
	c.mu.Lock()
	defer c.mu.Unlock()
	for d, l := range c.domains {
		if c.node.Behind(d) {
			select {
			case l.resync <- struct{}{}:
			default:
			}
		}
	}
	return err
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
		wg.Go(func() { c.expire(ctx, l) })
	}
	wg.Go(func() { c.report(ctx) })
	wg.Wait()
	return ctx.Err()
}

// expire drops the domain's shares to nothing when its grant expires
// without a renewal.
func (c *Client) expire(ctx context.Context, l *link) {
	for {
		at := c.node.Expires(l.domain)
		wait := time.Hour
		if !at.IsZero() {
			wait = max(at.Sub(c.opts.Now()), time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-l.renewed:
			t.Stop()
			continue
		case <-t.C:
		}
		doms, _ := c.node.Expire(c.opts.Now())
		for _, d := range doms {
			c.metrics.expired(d)
			c.log.Warn("grant expired without a renewal: holding nothing until the coordinator grants again", "domain", d)
		}
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
		reports := c.node.Reports(c.opts.Now())
		c.mu.Lock()
		for _, r := range reports {
			l := c.domains[r.Domain]
			if l == nil {
				continue
			}
			select {
			case <-l.reports: // drop the unsent older one
			default:
			}
			l.reports <- r
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
	hello, weights, err := c.node.Connect(c.opts.Now(), l.domain)
	if err != nil {
		return err
	}
	if err := st.Send(wire.Hello(hello, weights)); err != nil {
		return err
	}
	if r, ok := c.node.LastReport(c.opts.Now(), l.domain, c.opts.ReportEvery); ok && !hello.Leaving {
		if err := st.Send(wire.Report(r)); err != nil { // a new leader knows its demand at once
			return err
		}
	}
	c.metrics.connected(l.domain, true)
	acks := make(chan coordinator.Ack, 16)
	errc := make(chan error, 2)
	if hello.Leaving { // it left: this hello told the coordinator so
		go func() {
			_, err := st.Recv()
			errc <- err
		}()
		return c.linger(ctx, l, errc)
	}
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
				if ack, ok := c.assign(l, a); ok {
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
		case <-l.resync:
			return nil // a new stream: its full grant has the added limits' shares
		case a := <-l.leave:
			if err := st.Send(wire.Ack(a)); err != nil {
				return err // the next stream's hello says it left
			}
			return c.linger(ctx, l, errc)
		}
		if err := st.Send(msg); err != nil {
			return err
		}
	}
}

// leaveLinger is how long a stream that carried the instance's leave
// stays up before the leave counts as taken: one that breaks sooner may
// have lost it (leadership moved as it was sent), and the next stream's
// hello says it again.
const leaveLinger = 500 * time.Millisecond

// linger waits, once this stream told the coordinator that the instance
// left, for leaveLinger to pass (Leave returns: the leave is taken) or
// for the stream to break (the next stream says it again).
func (c *Client) linger(ctx context.Context, l *link, errc <-chan error) error {
	t := time.NewTimer(leaveLinger)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	case <-t.C:
	}
	l.leftOne.Do(func() { close(l.left) })
	<-ctx.Done() // nothing more to say
	return nil
}

// assign applies one assignment to the engine, lowerings first.
func (c *Client) assign(l *link, pa *allotv1.ShareAssignment) (coordinator.Ack, bool) {
	a := wire.FromAssignment(pa)
	now := c.opts.Now()
	_, ack, err := c.node.Assign(now, a)
	if err != nil && ack.Domain != "" {
		// Applied but for a share the engine refused: acknowledged, as the
		// rest is in force.
		c.log.Warn("assignment applied in part", "domain", l.domain, "err", err)
		err = nil
	}
	if err != nil {
		c.metrics.refused(l.domain)
		c.log.Debug("assignment not applied", "domain", l.domain, "term", a.Term, "version", a.Version, "err", err)
		return coordinator.Ack{}, false
	}
	select {
	case l.renewed <- struct{}{}:
	default:
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
