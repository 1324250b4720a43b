package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Flow is one kind of traffic: requests of one domain whose descriptor
// (DescKey = Prefix + i, i < Keys) matches one limit.
type Flow struct {
	Domain, Limit string
	DescKey       string
	Prefix        string
	Keys          int
	// Rate is requests per second over all regions.
	Rate float64
	// Reserve sends LLM reservations (Reserve, then Settle, Release or
	// nothing) instead of checks.
	Reserve bool
}

// Target is one enforcer instance the load client sends to.
type Target struct {
	Name, Region string
	Addr         string // gRPC
}

// LoadOptions configure a Load.
type LoadOptions struct {
	Flows []Flow
	// Weights is the part of every flow's rate each region gets (summing
	// to 1); regions left out get none.
	Weights map[string]float64
	// Deadline of every request.
	Deadline time.Duration
	// ReserveTTL is the TTL asked for each reservation.
	ReserveTTL time.Duration
	// MaxInFlight bounds the requests in flight per region; past it a
	// request is not sent (counted in Dropped).
	MaxInFlight int
	Log         *Log
	Seed        uint64
	// TLS verifies the targets (the cluster's CA); nil: plain text.
	TLS *tls.Config
}

// Load sends the flows to the targets and logs every decision. Its
// methods are safe for concurrent use.
type Load struct {
	opts    LoadOptions
	byName  map[string]*target
	regions map[string][]*target
	rr      atomic.Uint64
	// Dropped counts requests not sent: no instance of the region was
	// in service, or MaxInFlight requests were in flight.
	Dropped atomic.Int64
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup // generators and probers
}

type target struct {
	Target
	tls       *tls.Config // nil: plain text
	mu        sync.Mutex
	paused    bool
	life      int
	client    allotv1.RateLimiterClient
	conn      *grpc.ClientConn
	inflight  sync.WaitGroup // requests and reservation holds; Add only while !paused
	abandoned []pending      // reservations left to expire, to probe after their TTL
}

type pending struct {
	id       string
	flow     *Flow
	key      string
	reserved int64
	due      time.Time // when it must have expired
	life     int
}

// NewLoad connects to the targets (life 1 each); Start starts sending.
func NewLoad(opts LoadOptions, targets []Target) (*Load, error) {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	l := &Load{opts: opts, byName: map[string]*target{}, regions: map[string][]*target{}, stop: make(chan struct{})}
	for _, t := range targets {
		x := &target{Target: t, tls: opts.TLS}
		if err := x.connect(1); err != nil {
			l.Close()
			return nil, err
		}
		l.byName[t.Name] = x
		l.regions[t.Region] = append(l.regions[t.Region], x)
	}
	return l, nil
}

func (t *target) connect(life int) error {
	creds := insecure.NewCredentials()
	if t.tls != nil {
		creds = credentials.NewTLS(t.tls)
	}
	cc, err := grpc.NewClient(t.Addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("chaos: dial %s: %w", t.Name, err)
	}
	t.mu.Lock()
	old := t.conn
	t.conn, t.client, t.life = cc, allotv1.NewRateLimiterClient(cc), life
	t.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Close closes the connections. Call it after Stop.
func (l *Load) Close() {
	for _, t := range l.byName {
		t.mu.Lock()
		if t.conn != nil {
			t.conn.Close()
		}
		t.mu.Unlock()
	}
}

// Start sends the flows until Stop.
func (l *Load) Start() {
	rng := rand.New(rand.NewPCG(l.opts.Seed, 1))
	for region := range l.regions {
		w := l.opts.Weights[region]
		if w <= 0 {
			continue
		}
		seed := rng.Uint64()
		l.wg.Go(func() { l.generate(region, w, seed) })
	}
	l.wg.Go(l.probeLoop)
}

// generate sends region's part of every flow, open loop: the requests
// due in each 5 ms step are sent whatever the answers do.
func (l *Load) generate(region string, weight float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	sem := make(chan struct{}, l.opts.MaxInFlight)
	credit := make([]float64, len(l.opts.Flows))
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case now := <-tick.C:
			dt := now.Sub(last).Seconds()
			last = now
			for i := range l.opts.Flows {
				f := &l.opts.Flows[i]
				credit[i] += f.Rate * weight * dt
				for ; credit[i] >= 1; credit[i]-- {
					key := fmt.Sprintf("%s=%s%d", f.DescKey, f.Prefix, rng.IntN(max(f.Keys, 1)))
					t, life, client, ok := l.pick(region)
					if !ok {
						l.Dropped.Add(1)
						continue
					}
					select {
					case sem <- struct{}{}:
					default:
						t.inflight.Done()
						l.Dropped.Add(1)
						continue
					}
					hold := time.Duration(10+rng.IntN(290)) * time.Millisecond
					outcome := rng.IntN(100)
					prompt := int64(100 + rng.IntN(400))
					go func() {
						defer func() { <-sem; t.inflight.Done() }()
						if f.Reserve {
							l.reserve(t, life, client, f, key, prompt, hold, outcome)
						} else {
							l.check(t, life, client, f, key)
						}
					}()
				}
			}
		}
	}
}

// pick returns the next instance of region in service, with its
// in-flight count raised (the caller calls t.inflight.Done).
func (l *Load) pick(region string) (*target, int, allotv1.RateLimiterClient, bool) {
	ts := l.regions[region]
	n := l.rr.Add(1)
	for i := range ts {
		t := ts[(int(n)+i)%len(ts)]
		t.mu.Lock()
		if !t.paused {
			t.inflight.Add(1)
			life, client := t.life, t.client
			t.mu.Unlock()
			return t, life, client, true
		}
		t.mu.Unlock()
	}
	return nil, 0, nil, false
}

func descriptor(key string) []*allotv1.Descriptor {
	k, v := key, ""
	for i := range len(key) {
		if key[i] == '=' {
			k, v = key[:i], key[i+1:]
			break
		}
	}
	return []*allotv1.Descriptor{{Entries: []*allotv1.Entry{{Key: k, Value: v}}}}
}

// call runs one request with the deadline and fills rec's timing and
// error.
func (l *Load) call(rec *Record, do func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.Deadline)
	defer cancel()
	start := time.Now()
	err := do(ctx)
	done := time.Now()
	rec.At, rec.Done, rec.Latency, rec.Deadline = start.UnixNano(), done.UnixNano(), int64(done.Sub(start)), int64(l.opts.Deadline)
	if err != nil {
		rec.Err = status.Code(err).String()
		if s, ok := status.FromError(err); !ok || s.Code().String() == "Unknown" {
			rec.Err = "error: " + err.Error()
		}
	}
	rec.DeadlineMet = err == nil && done.Sub(start) <= l.opts.Deadline
}

func (l *Load) check(t *target, life int, client allotv1.RateLimiterClient, f *Flow, key string) {
	rec := Record{Kind: KindCheck, Region: t.Region, Instance: t.Name, Life: life, Domain: f.Domain, Limit: f.Limit, Key: key, Hits: 1}
	req := &allotv1.CheckRequest{Items: []*allotv1.CheckItem{{Domain: f.Domain, Descriptors: descriptor(key), Hits: proto.Int64(1)}}}
	l.call(&rec, func(ctx context.Context) error {
		resp, err := client.Check(ctx, req)
		if err != nil {
			return err
		}
		if len(resp.GetResults()) != 1 {
			return fmt.Errorf("%d results for one item", len(resp.GetResults()))
		}
		res := resp.GetResults()[0]
		rec.Allowed = res.GetAllowed()
		if ls := res.GetLimits(); len(ls) != 1 || ls[0].GetName() != f.Limit {
			return fmt.Errorf("%s matched %d limits, want only %s", key, len(ls), f.Limit)
		}
		return nil
	})
	l.opts.Log.Write(&rec)
}

// reserve holds a reservation for hold and then settles it (70 in 100),
// releases it (15) or abandons it (15) to expire.
func (l *Load) reserve(t *target, life int, client allotv1.RateLimiterClient, f *Flow, key string, prompt int64, hold time.Duration, outcome int) {
	const maxTokens = 800
	rec := Record{Kind: KindReserve, Region: t.Region, Instance: t.Name, Life: life, Domain: f.Domain, Limit: f.Limit, Key: key}
	req := &allotv1.ReserveRequest{Domain: f.Domain, Descriptors: descriptor(key), PromptTokens: prompt, MaxTokens: maxTokens,
		Model: "chaos", Ttl: durationpb.New(l.opts.ReserveTTL)}
	l.call(&rec, func(ctx context.Context) error {
		resp, err := client.Reserve(ctx, req)
		if err != nil {
			return err
		}
		rec.Allowed, rec.ID, rec.Tokens = resp.GetAllowed(), resp.GetReservationId(), resp.GetReservedTokens()
		rec.Hits = rec.Tokens
		return nil
	})
	l.opts.Log.Write(&rec)
	if !rec.Answered() || !rec.Allowed {
		return
	}
	if outcome >= 85 { // abandoned, as by a crashed gateway
		t.mu.Lock()
		t.abandoned = append(t.abandoned, pending{id: rec.ID, flow: f, key: key, reserved: rec.Tokens, life: life,
			due: time.Unix(0, rec.Done).Add(l.opts.ReserveTTL)})
		t.mu.Unlock()
		return
	}
	timer := time.NewTimer(hold) // the LLM call streams
	defer timer.Stop()
	<-timer.C
	end := Record{Kind: KindSettle, Region: t.Region, Instance: t.Name, Life: life, Domain: f.Domain, Limit: f.Limit, Key: key, ID: rec.ID}
	if outcome < 70 {
		output := int64(rand.IntN(maxTokens))
		end.Tokens = prompt + output
		l.call(&end, func(ctx context.Context) error {
			resp, err := client.Settle(ctx, &allotv1.SettleRequest{ReservationId: rec.ID, InputTokens: prompt, OutputTokens: output})
			end.State, end.Late = resp.GetSettlement().GetState(), resp.GetSettlement().GetLate()
			return err
		})
	} else {
		end.Kind, end.Tokens = KindRelease, prompt
		l.call(&end, func(ctx context.Context) error {
			resp, err := client.Release(ctx, &allotv1.ReleaseRequest{ReservationId: rec.ID, UsedTokens: prompt})
			end.State, end.Late = resp.GetSettlement().GetState(), resp.GetSettlement().GetLate()
			return err
		})
	}
	l.opts.Log.Write(&end)
}

// probeLoop probes, every second, the abandoned reservations past their
// TTL (and the expiry tick), before the server forgets them.
func (l *Load) probeLoop() {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		for _, t := range l.byName {
			l.probe(t, time.Now())
		}
	}
}

// expiryMargin is how long after its TTL a reservation is surely
// expired: the enforcer settles expired ones every 250 ms.
const expiryMargin = time.Second

// probe releases, at their reserved amount, t's abandoned reservations
// due before now: each answer says whether it had expired (late).
func (l *Load) probe(t *target, now time.Time) {
	t.mu.Lock()
	var due, keep []pending
	for _, p := range t.abandoned {
		if p.due.Add(expiryMargin).Before(now) {
			due = append(due, p)
		} else {
			keep = append(keep, p)
		}
	}
	t.abandoned = keep
	client, life := t.client, t.life
	t.mu.Unlock()
	for _, p := range due {
		rec := Record{Kind: KindProbe, Region: t.Region, Instance: t.Name, Life: p.life, Domain: p.flow.Domain, Limit: p.flow.Limit, Key: p.key,
			ID: p.id, Tokens: p.reserved}
		if p.life != life {
			rec.Err = "the instance restarted before the probe"
			l.opts.Log.Write(&rec)
			continue
		}
		l.call(&rec, func(ctx context.Context) error {
			resp, err := client.Release(ctx, &allotv1.ReleaseRequest{ReservationId: p.id, UsedTokens: p.reserved})
			rec.State, rec.Late = resp.GetSettlement().GetState(), resp.GetSettlement().GetLate()
			return err
		})
		l.opts.Log.Write(&rec)
	}
}

// Drain takes instance name out of service, as a load balancer would
// before a restart: no new requests go to it, and Drain returns once
// those in flight are answered, its reservations are settled or released
// and the abandoned ones have expired and been probed.
func (l *Load) Drain(ctx context.Context, name string) error {
	t := l.byName[name]
	if t == nil {
		return fmt.Errorf("chaos: no instance %q", name)
	}
	t.mu.Lock()
	t.paused = true
	t.mu.Unlock()
	done := make(chan struct{})
	go func() { t.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("chaos: drain %s: requests still in flight: %w", name, ctx.Err())
	}
	return l.expireAbandoned(ctx, t)
}

// expireAbandoned waits for t's abandoned reservations to be due and
// probes them.
func (l *Load) expireAbandoned(ctx context.Context, t *target) error {
	t.mu.Lock()
	var last time.Time
	for _, p := range t.abandoned {
		if p.due.After(last) {
			last = p.due
		}
	}
	t.mu.Unlock()
	if wait := time.Until(last.Add(expiryMargin)); wait > 0 {
		timer := time.NewTimer(wait + time.Millisecond) // a TTL to pass, not a readiness to poll
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.probe(t, time.Now())
	return nil
}

// Resume puts instance name back in service as its life-th process: a
// new connection, up before it returns.
func (l *Load) Resume(ctx context.Context, name string, life int) error {
	t := l.byName[name]
	if t == nil {
		return fmt.Errorf("chaos: no instance %q", name)
	}
	if err := t.connect(life); err != nil {
		return err
	}
	t.mu.Lock()
	cc := t.conn
	t.mu.Unlock()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("chaos: resume %s: connection %v: %w", name, s, ctx.Err())
		}
	}
	t.mu.Lock()
	t.paused = false
	t.mu.Unlock()
	return nil
}

// Abort stops sending and returns once no new request can start (those
// in flight may still be answered). Stop does it first.
func (l *Load) Abort() {
	l.stopped.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// Stop stops sending, waits for the requests in flight and the
// reservations held, then for the abandoned ones to expire, and probes
// them.
func (l *Load) Stop(ctx context.Context) error {
	l.Abort()
	var errs []error
	for _, t := range l.byName {
		t.mu.Lock()
		t.paused = true
		t.mu.Unlock()
	}
	for _, t := range l.byName {
		t.inflight.Wait()
	}
	for _, t := range l.byName {
		errs = append(errs, l.expireAbandoned(ctx, t))
	}
	return errors.Join(errs...)
}
