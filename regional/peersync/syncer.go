package peersync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/tlsx"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
	"github.com/allot-dev/allot/regional/node"
)

// Defaults of Options.
const (
	DefaultLendTimeout = 200 * time.Millisecond
	DefaultQueue       = 64
	// maxLends bounds the Lend calls in flight.
	maxLends = 64
	// maxBackoff bounds the wait between two dials of a peer: a
	// partition's end is noticed within it.
	maxBackoff = 500 * time.Millisecond
)

// Options configure a Syncer.
type Options struct {
	// Region names this region; Instance this process in it (default:
	// host-pid-random).
	Region, Instance string
	// Engine is the region's engine. New calls its SetPeers with the
	// regions of Peers.
	Engine *regional.Engine
	// Peers are the other regions and the gRPC address that reaches
	// their enforcers.
	Peers map[string]string
	// Counts, when set, is the CountStore the region's instances share
	// (the regional Redis): the region's slot is the sum over them. nil:
	// this instance is its region's only one.
	Counts regional.CountStore
	// Node is the instance's core (its engine, region, instance and
	// CountStore name it); nil: one made from Engine, Region, Instance and
	// Counts. The coordinator link of the same process shares it.
	Node *node.Node
	// Tick is how often due deltas go out and loans are asked; 0 means a
	// tenth of the shortest sync interval of the configuration, within
	// [10ms, 250ms].
	Tick time.Duration
	// Heartbeat is how often a message goes to each peer when no delta
	// does; 0 means half the shortest sync interval.
	Heartbeat time.Duration
	// LendTimeout bounds a Lend call; 0 means DefaultLendTimeout.
	LendTimeout time.Duration
	// Queue bounds the messages waiting for a peer; 0 means DefaultQueue.
	Queue int
	// Credentials secure the streams to the peers (TLS with this
	// instance's client certificate: Peer requires one when it runs TLS);
	// nil means plain text.
	Credentials credentials.TransportCredentials
	DialOptions []grpc.DialOption // added after the credentials
	Registry    prometheus.Registerer
	Logger      *slog.Logger
	Now         func() time.Time
}

// Syncer links a region's engine to its peers. Safe for concurrent use;
// the zero value is not usable, call New.
type Syncer struct {
	allotv1.UnimplementedPeerServer
	opts    Options
	engine  *regional.Engine
	node    *node.Node
	log     *slog.Logger
	metrics *metrics
	out     map[string]*outbound // by peer region
	lends   chan struct{}        // semaphore of Lend calls
	streams atomic.Uint64
	quit    chan struct{} // closed by Shutdown: served streams end
	quitted sync.Once
}

// outbound is this instance's stream to one peer region.
type outbound struct {
	region string
	cc     *grpc.ClientConn
	client allotv1.PeerClient
	queue  chan *allotv1.SyncMessage
}

// New returns a Syncer; Register serves its Peer API and Run starts it.
func New(opts Options) (*Syncer, error) {
	if opts.Node != nil {
		opts.Engine, opts.Region, opts.Instance = opts.Node.Engine(), opts.Node.Region(), opts.Node.Instance()
	}
	if opts.Engine == nil || opts.Region == "" {
		return nil, errors.New("peersync: Engine and Region are required")
	}
	if opts.Instance == "" {
		host, _ := os.Hostname()
		opts.Instance = fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32())
	}
	if opts.Node == nil {
		n, err := node.New(node.Options{Region: opts.Region, Instance: opts.Instance, Engine: opts.Engine, Counts: opts.Counts})
		if err != nil {
			return nil, fmt.Errorf("peersync: %w", err)
		}
		opts.Node = n
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.LendTimeout <= 0 {
		opts.LendTimeout = DefaultLendTimeout
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	tick, heartbeat := node.PeerIntervals(opts.Engine.Config())
	if opts.Tick <= 0 {
		opts.Tick = tick
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = heartbeat
	}
	if err := opts.Engine.SetPeers(opts.Region, slices.Sorted(maps.Keys(opts.Peers))); err != nil {
		return nil, fmt.Errorf("peersync: %w", err)
	}
	s := &Syncer{opts: opts, engine: opts.Engine, node: opts.Node, log: opts.Logger.With("region", opts.Region),
		out: map[string]*outbound{}, lends: make(chan struct{}, maxLends), quit: make(chan struct{})}
	s.metrics = newMetrics(s, opts.Registry)
	// A peer back from a partition is redialled within maxBackoff, not
	// gRPC's default of up to two minutes.
	creds := opts.Credentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: time.Second,
		}),
	}, opts.DialOptions...)
	for region, addr := range opts.Peers {
		cc, err := grpc.NewClient(addr, dial...)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("peersync: peer %s at %s: %w", region, addr, err)
		}
		s.out[region] = &outbound{region: region, cc: cc, client: allotv1.NewPeerClient(cc), queue: make(chan *allotv1.SyncMessage, opts.Queue)}
	}
	return s, nil
}

// Register serves allot.v1.Peer on gs.
func (s *Syncer) Register(gs grpc.ServiceRegistrar) { allotv1.RegisterPeerServer(gs, s) }

// Shutdown ends the peers' Sync streams this Syncer serves, now and from
// now on (they redial, elsewhere or later), so that a graceful stop of
// its gRPC server does not wait for them: call it before GracefulStop.
// Idempotent.
func (s *Syncer) Shutdown() { s.quitted.Do(func() { close(s.quit) }) }

// Close closes the connections to the peers. Call it after Run returned.
func (s *Syncer) Close() {
	for _, o := range s.out {
		o.cc.Close()
	}
}

// Run dials every peer and ticks until ctx ends.
func (s *Syncer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, o := range s.out {
		wg.Go(func() { s.keep(ctx, o) })
	}
	wg.Go(func() { s.ticks(ctx) })
	wg.Wait()
	return ctx.Err()
}

// ticks sends what is due every tick: deltas (or a heartbeat) to every
// peer, and loan asks.
func (s *Syncer) ticks(ctx context.Context) {
	t := time.NewTicker(s.opts.Tick)
	defer t.Stop()
	var lastSent time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := s.opts.Now()
		batches := s.outboundBatches(ctx, now)
		if len(batches) > 0 || now.Sub(lastSent) >= s.opts.Heartbeat {
			lastSent = now
			m := &allotv1.SyncMessage{SentUnixNano: now.UnixNano()}
			for _, b := range batches {
				m.Batches = append(m.Batches, encodeBatch(b))
			}
			for _, o := range s.out {
				s.enqueue(o, m)
			}
		}
		for _, a := range s.engine.LoanAsks(now) {
			select {
			case s.lends <- struct{}{}:
				go func() { defer func() { <-s.lends }(); s.lend(ctx, a) }()
			default:
				s.engine.Credit(now, a, regional.LoanGrant{}, errors.New("peersync: too many Lend calls in flight"))
			}
		}
	}
}

// outboundBatches runs the instance's side of a tick (node.Node.SyncOut:
// with a CountStore, this instance's counts and the peers' slots it
// received are merged in the store first).
func (s *Syncer) outboundBatches(ctx context.Context, now time.Time) []regional.Batch {
	mctx, cancel := context.WithTimeout(ctx, max(s.opts.Tick, 50*time.Millisecond))
	defer cancel()
	batches, err := s.node.SyncOut(mctx, now)
	if err != nil {
		s.log.Debug("count store merge failed", "err", err)
	}
	return batches
}

// enqueue queues m for o's stream, or drops it when the queue is full:
// the peer will see a gap and resync.
func (s *Syncer) enqueue(o *outbound, m *allotv1.SyncMessage) {
	select {
	case o.queue <- m:
	default:
		s.metrics.dropped.WithLabelValues(o.region).Inc()
	}
}

// keep keeps o's stream up, with backoff.
func (s *Syncer) keep(ctx context.Context, o *outbound) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := s.session(ctx, o)
		s.metrics.connected.WithLabelValues(o.region).Set(0)
		if ctx.Err() != nil {
			return
		}
		s.log.Debug("peer stream ended", "peer", o.region, "err", err)
		if time.Since(start) > 5*time.Second {
			backoff = 50 * time.Millisecond
		}
		sleep(ctx, backoff+time.Duration(rand.Int64N(int64(backoff/2)+1)))
		backoff = min(2*backoff, maxBackoff)
	}
}

// session runs one stream to o until it fails.
func (s *Syncer) session(ctx context.Context, o *outbound) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := o.client.Sync(sctx)
	if err != nil {
		return err
	}
	for len(o.queue) > 0 { // superseded by the full states
		<-o.queue
	}
	now := s.opts.Now()
	first := &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: s.opts.Region, Instance: s.opts.Instance}, SentUnixNano: now.UnixNano()}
	for _, b := range s.engine.FullStates() {
		first.Batches = append(first.Batches, encodeBatch(b))
	}
	if err := s.send(st, o.region, first); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- s.replies(st, o) }()
	for {
		select {
		case err := <-errc:
			return err
		case m := <-o.queue:
			if err := s.send(st, o.region, m); err != nil {
				return err
			}
		}
	}
}

// send sends m on a stream and counts it.
func (s *Syncer) send(st interface {
	Send(*allotv1.SyncMessage) error
}, peer string, m *allotv1.SyncMessage) error {
	if err := st.Send(m); err != nil {
		return err
	}
	s.metrics.messages.WithLabelValues(peer, "out").Inc()
	for _, b := range m.Batches {
		s.metrics.batches.WithLabelValues(peer, "out").Inc()
		s.metrics.bytes.WithLabelValues(peer, "out").Add(float64(len(b.Deltas)))
		if b.Full && b.Seq > 0 && m.Hello == nil {
			s.metrics.resyncs.WithLabelValues(peer, "served").Inc()
		}
	}
	return nil
}

// replies reads what the peer answers on o's stream: its hello,
// heartbeats, resync requests and rejections.
func (s *Syncer) replies(st allotv1.Peer_SyncClient, o *outbound) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	if h := m.GetHello(); h == nil || h.GetRegion() != o.region {
		return fmt.Errorf("peersync: %s answered with hello %v", o.region, h)
	}
	s.metrics.connected.WithLabelValues(o.region).Set(1)
	for {
		now := s.opts.Now()
		s.metrics.messages.WithLabelValues(o.region, "in").Inc()
		s.metrics.observeLag(o.region, time.Unix(0, m.GetSentUnixNano()), now)
		s.engine.Heard(now, o.region)
		for _, r := range m.GetResync() {
			full, err := s.engine.FullState(r.GetDomain(), r.GetLimit())
			if err != nil {
				s.log.Debug("resync of an unknown limit asked", "peer", o.region, "domain", r.GetDomain(), "limit", r.GetLimit(), "err", err)
				continue
			}
			s.enqueue(o, &allotv1.SyncMessage{SentUnixNano: now.UnixNano(), Batches: []*allotv1.DeltaBatch{encodeBatch(full)}})
		}
		for _, rj := range m.GetRejections() {
			s.log.Debug("a peer refused a batch", "peer", o.region, "domain", rj.GetDomain(), "limit", rj.GetLimit(), "reason", rj.GetReason(), "message", rj.GetMessage())
		}
		if m, err = st.Recv(); err != nil {
			return err
		}
	}
}

// Sync serves a peer's stream: it merges the peer's batches into the
// engine and answers with heartbeats, resync requests and rejections.
func (s *Syncer) Sync(st allotv1.Peer_SyncServer) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	h := m.GetHello()
	switch {
	case h == nil:
		return s.refuse(ErrNoHello)
	}
	if err := checkCaller(st.Context(), h.GetRegion(), h.GetInstance()); err != nil {
		return s.refuse(err)
	}
	switch {
	case !slices.Contains(s.engine.Peers(), h.GetRegion()):
		return s.refuse(fmt.Errorf("%w: %q is not a peer of %s", regional.ErrUnknownPeer, h.GetRegion(), s.opts.Region))
	}
	peer := h.GetRegion()
	stream := fmt.Sprintf("%s/%s/%d", peer, h.GetInstance(), s.streams.Add(1))
	defer s.engine.Forget(stream)
	hello := &allotv1.SyncMessage{Hello: &allotv1.SyncHello{Region: s.opts.Region, Instance: s.opts.Instance}, SentUnixNano: s.opts.Now().UnixNano()}
	if err := s.send(st, peer, hello); err != nil {
		return err
	}
	replies := make(chan *allotv1.SyncMessage, 16)
	if err := s.receive(peer, stream, m, replies); err != nil {
		return err
	}
	// One goroutine receives, this one sends: replies, heartbeats and
	// the resync requests still pending.
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err == nil {
				err = s.receive(peer, stream, m, replies)
			}
			if err != nil {
				recvErr <- err
				return
			}
		}
	}()
	t := time.NewTicker(s.opts.Heartbeat)
	defer t.Stop()
	for {
		var m *allotv1.SyncMessage
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m = <-replies:
		case <-s.quit:
			return status.Error(codes.Unavailable, "peersync: shutting down")
		case <-t.C:
			now := s.opts.Now()
			m = &allotv1.SyncMessage{SentUnixNano: now.UnixNano()}
			for _, b := range s.engine.PendingResyncs(now, stream) {
				m.Resync = append(m.Resync, &allotv1.LimitRef{Domain: b.Domain, Limit: b.Limit})
			}
		}
		if err := s.send(st, peer, m); err != nil {
			return err
		}
	}
}

// refuse counts a refusal that ends a stream or a call and returns its
// status.
func (s *Syncer) refuse(err error) error {
	_, reason, _ := classify(err)
	s.metrics.rejections.WithLabelValues(reason).Inc()
	s.log.Debug("peer stream refused", "reason", reason, "err", err)
	return grpcError(err)
}

// receive merges one message of a peer's stream; it returns the status
// that ends the stream for a fatal error.
func (s *Syncer) receive(peer, stream string, m *allotv1.SyncMessage, replies chan<- *allotv1.SyncMessage) error {
	now := s.opts.Now()
	s.metrics.messages.WithLabelValues(peer, "in").Inc()
	s.metrics.observeLag(peer, time.Unix(0, m.GetSentUnixNano()), now)
	s.engine.Heard(now, peer)
	var reply allotv1.SyncMessage
	for _, db := range m.GetBatches() {
		s.metrics.batches.WithLabelValues(peer, "in").Inc()
		s.metrics.bytes.WithLabelValues(peer, "in").Add(float64(len(db.GetDeltas())))
		b, err := decodeBatch(peer, db)
		if err != nil {
			return s.refuse(err)
		}
		resync, err := s.node.Inbound(now, regional.Source{Region: peer, Stream: stream}, b)
		if err != nil {
			_, reason, fatal := classify(err)
			if fatal {
				return s.refuse(err)
			}
			s.metrics.rejections.WithLabelValues(reason).Inc()
			reply.Rejections = append(reply.Rejections, &allotv1.PeerRejection{Domain: b.Domain, Limit: b.Limit, Reason: reason, Message: err.Error()})
			continue
		}
		if resync {
			s.metrics.resyncs.WithLabelValues(peer, "requested").Inc()
			reply.Resync = append(reply.Resync, &allotv1.LimitRef{Domain: b.Domain, Limit: b.Limit})
		}
	}
	if len(reply.Resync) > 0 || len(reply.Rejections) > 0 {
		reply.SentUnixNano = now.UnixNano()
		select {
		case replies <- &reply:
		default: // the peer is not reading: it will be asked again
		}
	}
	return nil
}

// checkCaller checks, for a call over TLS, that the caller's certificate
// names an enforcer of the region a hello or a loan ask declares, and the
// instance the hello names, if any. A call in plain text (loopback only)
// passes: there is nothing to check it against.
func checkCaller(ctx context.Context, region, instance string) error {
	id, secured, err := tlsx.Caller(ctx)
	switch {
	case !secured:
		return nil
	case err != nil:
		return fmt.Errorf("a Peer call for region %q: %w", region, err)
	}
	return id.SpeaksFor(region, cmp.Or(instance, id.Instance))
}

// Lend answers a peer's loan ask.
func (s *Syncer) Lend(ctx context.Context, req *allotv1.LendRequest) (*allotv1.LendResponse, error) {
	if err := checkCaller(ctx, req.GetRegion(), ""); err != nil {
		return nil, s.refuse(err)
	}
	g, err := s.engine.Lend(s.opts.Now(), regional.LoanRequest{
		From: req.GetRegion(), Domain: req.GetDomain(), Limit: req.GetLimit(), Key: req.GetKey(),
		Window: req.GetWindow(), Amount: req.GetAmount(), ID: req.GetLoanId(),
	})
	if err != nil {
		_, reason, _ := classify(err)
		s.metrics.rejections.WithLabelValues(reason).Inc()
		return nil, grpcError(err)
	}
	return &allotv1.LendResponse{Granted: g.Granted, Remaining: g.Remaining, Refused: g.Refused}, nil
}

// lend asks a peer for a loan and gives the answer to the engine.
func (s *Syncer) lend(ctx context.Context, a regional.LoanAsk) {
	o := s.out[a.Peer]
	if o == nil {
		s.engine.Credit(s.opts.Now(), a, regional.LoanGrant{}, regional.ErrUnknownPeer)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.LendTimeout)
	defer cancel()
	resp, err := o.client.Lend(cctx, &allotv1.LendRequest{Region: s.opts.Region, Domain: a.Domain, Limit: a.Limit,
		Key: a.Key, Window: a.Window, Amount: a.Amount, LoanId: a.ID})
	g := regional.LoanGrant{Granted: resp.GetGranted(), Remaining: resp.GetRemaining(), Refused: resp.GetRefused()}
	result := "granted"
	switch {
	case err != nil:
		result = "error"
		s.log.Debug("lend failed", "peer", a.Peer, "code", status.Code(err), "err", err)
	case g.Granted <= 0:
		result = "refused"
	}
	s.metrics.loanCalls.WithLabelValues(a.Peer, result).Inc()
	s.engine.Credit(s.opts.Now(), a, g, err)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
