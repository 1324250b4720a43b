package server

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// Envoy's rate limit quota service (RLQS),
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService: Envoy decides
// in its own process with token buckets that allot sizes, and reports what
// it allowed and denied on a long-lived stream.
//
// Stream. The first report names the domain; later reports may repeat it
// or leave it empty, and a different one is InvalidArgument. A report is
// validated as a whole before anything is recorded; a bad one closes the
// stream with InvalidArgument (empty report, bucket id empty, with an
// empty key or value, or more than regional.MaxEntries entries, a
// bucket twice in one report, time_elapsed negative or above a day,
// counts above allot.MaxAmount, more than MaxBuckets buckets on the
// stream) or NotFound (a domain the configuration lacks), and charges
// nothing. A bucket id is a descriptor of the domain, its entries sorted by
// key (so an Envoy-paths domain matches it only with limits whose match
// is in key order). Every report is answered with one action per bucket
// it names, in order.
//
// Sizing. A bucket is decided by the request-counting limits that match
// it, as a check would match them; shadow and unlimited limits never
// restrict it. A bucket with no such limit gets ALLOW_ALL. For each
// limit key the region's allowance is the key's effective limit (plans,
// overrides) × the region's share of the key (its own share when it is
// hot, else the limit's default) ÷ the region's live instances (with a
// regional store; 1 without), as rate and burst (a sliding window's
// burst is its amount). The (stream, bucket) pairs that match a key share
// it: pair i's target is (1−Floor)·dᵢ/D + Floor/n, where dᵢ is its
// demand ((allowed+denied) ÷ time_elapsed, smoothed over DemandWindow), a
// pair with no demand measured yet counting as the mean of the measured
// ones, D their sum and n the pair count; with D = 0 every target is 1/n.
// A target is at least one token's worth of the burst. A pair is granted
// min(target, 1 − the grants of the other pairs still in force), so the
// grants on a key never add up to more than its allowance; a pair short
// of its target wakes the streams holding more than theirs, which then
// send smaller assignments at once, and a pair that shrinks or leaves
// wakes the ones short of theirs. The bucket's token bucket is the least
// over its keys: max_tokens = ⌊grant × burst⌋ and a refill of
// ⌊grant × amount⌋ tokens per period (one token per a longer interval
// below one); less than one token is DENY_ALL. A new assignment
// replaces the Envoy's bucket with a full one, so small changes are not
// sent: a pair keeps a grant up to Hysteresis above its new target while
// no other pair is short of its own by more than Hysteresis, and an
// increase of at most Hysteresis is withheld (the Envoy keeps the smaller
// assignment). Every other decrease is sent at once.
// assignment_time_to_live is TTLFactor × the bucket's report interval
// (the longest recent time_elapsed), within [MinTTL, MaxTTL]; MaxTTL
// before an interval is known.
//
// Abandon. Every Tick the stream re-evaluates its buckets against the
// configuration and the shares in force: a bucket whose limits no longer
// match (or whose domain was removed) gets an AbandonAction and is
// forgotten, as is one not reported for its TTL (Envoy stopped using it)
// or reported without requests for IdleAfter; its grants go back to the
// other pairs. A later report of an unknown domain closes the stream with
// NotFound. A stream that ends gives back all its grants.
//
// Charging. The allowed counts of every report are charged to the
// matching limits' keys in the engine (Engine.ChargeReported, which may
// take a balance below zero), and allowed and denied are counted as
// demand, so that the coordinator sees Envoys' traffic and allot's other
// APIs see what Envoys consumed. Reports are deltas (Envoy resets its
// counts after each), so nothing is charged twice by RLQS itself. The
// engine's balance does not feed back into the assignments, which are
// sized from the allowance alone: requests of the same keys checked
// through another API (Check, ShouldRateLimit) are charged there as well,
// so a gateway must not send the same requests through both, and
// traffic through both APIs on one key can reach up to twice the
// allowance. Limits enforced leased or exact are charged in this
// instance's engine, not in the regional store.

// RLQS defaults.
const (
	DefaultRLQSTTLFactor    = 3
	DefaultRLQSMinTTL       = time.Second
	DefaultRLQSMaxTTL       = time.Minute
	DefaultRLQSTick         = time.Second
	DefaultRLQSIdleAfter    = 10 * time.Minute
	DefaultRLQSMaxBuckets   = 10000
	DefaultRLQSFloor        = 0.1
	DefaultRLQSHysteresis   = 0.05
	DefaultRLQSDemandWindow = 10 * time.Second
)

// rlqsMaxElapsed bounds a report's time_elapsed.
const rlqsMaxElapsed = 24 * time.Hour

// RLQSOptions configure the rate limit quota service; zero fields take
// the defaults above.
type RLQSOptions struct {
	// Registry receives the allot_regional_rlqs_* metrics; nil exports none.
	Registry prometheus.Registerer
	// assignment_time_to_live is TTLFactor × a bucket's report interval,
	// within [MinTTL, MaxTTL]; MaxTTL while the interval is unknown.
	TTLFactor      float64
	MinTTL, MaxTTL time.Duration
	// Tick is how often a stream re-evaluates its buckets: configuration
	// and share changes, buckets to forget.
	Tick time.Duration
	// IdleAfter abandons a bucket reported without requests for that
	// long; negative never does.
	IdleAfter time.Duration
	// MaxBuckets bounds the buckets one stream tracks.
	MaxBuckets int
	// Floor is the part of a key's allowance split evenly between the
	// Envoys that report on it, whatever their demand; at most 1,
	// negative for none.
	Floor float64
	// Hysteresis is the relative increase of an assignment that is not
	// worth sending on its own; negative sends every change.
	Hysteresis float64
	// DemandWindow smooths an Envoy's demand: a report covering this long
	// or more replaces it.
	DemandWindow time.Duration
}

func (o RLQSOptions) withDefaults() RLQSOptions {
	o.TTLFactor = cmp.Or(o.TTLFactor, DefaultRLQSTTLFactor)
	o.MinTTL = cmp.Or(o.MinTTL, DefaultRLQSMinTTL)
	o.MaxTTL = max(cmp.Or(o.MaxTTL, DefaultRLQSMaxTTL), o.MinTTL)
	o.Tick = cmp.Or(o.Tick, DefaultRLQSTick)
	o.IdleAfter = cmp.Or(o.IdleAfter, DefaultRLQSIdleAfter)
	o.MaxBuckets = cmp.Or(o.MaxBuckets, DefaultRLQSMaxBuckets)
	o.Floor = min(max(cmp.Or(o.Floor, DefaultRLQSFloor), 0), 1)
	switch {
	case o.Hysteresis == 0:
		o.Hysteresis = DefaultRLQSHysteresis
	case o.Hysteresis < 0:
		o.Hysteresis = 0
	}
	o.DemandWindow = cmp.Or(o.DemandWindow, DefaultRLQSDemandWindow)
	return o
}

// RLQS serves Envoy's rate limit quota service for a Service. Its quota
// book is shared by all its streams: register one RLQS per Service (on
// several gRPC servers if need be), never several. The zero value is not
// usable; call NewRLQS. Safe for concurrent use.
type RLQS struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	s       *Service
	opts    RLQSOptions
	book    *quotaBook
	metrics *rlqsMetrics
}

// NewRLQS returns the rate limit quota service of s.
func NewRLQS(s *Service, opts RLQSOptions) *RLQS {
	opts = opts.withDefaults()
	return &RLQS{s: s, opts: opts, book: newQuotaBook(opts.Floor, opts.Hysteresis), metrics: newRLQSMetrics(opts.Registry)}
}

// Register registers q on gs.
func (q *RLQS) Register(gs grpc.ServiceRegistrar) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, q)
}

// registerRLQS registers s's rate limit quota service on gs (one quota
// book per Service, however many servers it is registered on).
func registerRLQS(gs grpc.ServiceRegistrar, s *Service) {
	s.rlqs.Register(gs)
}

// StreamRateLimitQuotas serves one Envoy's stream: it answers each report
// and pushes the changes that ticks and other streams cause.
func (q *RLQS) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx := stream.Context()
	st := &rlqsStream{q: q, buckets: make(map[string]*rlqsBucket), wake: make(chan struct{}, 1)}
	q.metrics.streams.Inc()
	defer q.metrics.streams.Dec()
	defer func() { st.close(q.s.now()) }()

	// The receiver ends when Recv fails, which it does once this handler
	// has returned and the stream's context is cancelled.
	reports := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := time.NewTicker(q.opts.Tick)
	defer tick.Stop()
	for {
		var resp *rlqsv3.RateLimitQuotaResponse
		var err error
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case r := <-reports:
			resp, err = st.report(r)
		case <-tick.C:
			resp = st.refresh(true)
		case <-st.wake:
			resp = st.refresh(false)
		}
		if err != nil {
			q.metrics.errors.WithLabelValues(reason(err)).Inc()
			q.s.log.Debug("rlqs stream refused", "domain", st.domain, "err", err)
			return grpcError(err)
		}
		if len(resp.GetBucketAction()) > 0 {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// rlqsStream is one Envoy's stream. Its fields are owned by the stream's
// goroutine, except dirty, guarded by the book's lock.
type rlqsStream struct {
	q       *RLQS
	domain  string                 // fixed by the first report
	buckets map[string]*rlqsBucket // by bucketKey
	wake    chan struct{}          // signalled when dirty gains a consumer
	dirty   []*consumer            // guarded by q.book.mu: buckets to re-evaluate
	limits  []regional.QuotaLimit  // scratch
}

// rlqsBucket is a bucket one stream reports on.
type rlqsBucket struct {
	key        string
	id         *rlqsv3.BucketId
	desc       allot.Descriptor
	c          *consumer     // its part in the book
	interval   time.Duration // the longest recent time_elapsed; 0 unknown
	lastReport time.Time
	lastActive time.Time   // last report with requests (or the first)
	matched    bool        // some limit matched it: losing them all abandons it
	sent       *rlqsAssign // the assignment last sent
}

// rlqsAssign is an assignment: a blanket rule or a token bucket.
type rlqsAssign struct {
	allow, deny bool // blanket rules
	maxTokens   uint32
	perFill     uint32
	interval    time.Duration // fill interval
}

func (a *rlqsAssign) rate() float64 { return float64(a.perFill) / a.interval.Seconds() }

func (a *rlqsAssign) kind() string {
	switch {
	case a.allow:
		return "allow_all"
	case a.deny:
		return "deny_all"
	}
	return "token_bucket"
}

// worthSending reports whether next should replace prev at the Envoy:
// another kind, any decrease, or an increase above h.
func worthSending(prev, next *rlqsAssign, h float64) bool {
	if prev == nil || prev.kind() != next.kind() {
		return true
	}
	if next.allow || next.deny {
		return false
	}
	pm, nm, pr, nr := float64(prev.maxTokens), float64(next.maxTokens), prev.rate(), next.rate()
	return nm < pm || nr < pr || nm > pm*(1+h) || nr > pr*(1+h)
}

func (a *rlqsAssign) strategy() *typev3.RateLimitStrategy {
	switch {
	case a.allow:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	case a.deny:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     a.maxTokens,
		TokensPerFill: wrapperspb.UInt32(a.perFill),
		FillInterval:  durationpb.New(a.interval),
	}}}
}

// rlqsUsage is one validated bucket usage of a report.
type rlqsUsage struct {
	key             string
	bucket          map[string]string
	desc            allot.Descriptor
	elapsed         time.Duration
	allowed, denied int64
}

// report validates r as a whole, charges it, and answers every bucket it
// names. Its errors are for grpcError; nothing is charged when it returns
// one.
func (st *rlqsStream) report(r *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	q := st.q
	domain := r.GetDomain()
	switch {
	case st.domain == "" && domain == "":
		return nil, fmt.Errorf("%w: the first report names no domain", ErrBadRequest)
	case st.domain != "" && domain != "" && domain != st.domain:
		return nil, fmt.Errorf("%w: domain %q, the stream's is %q", ErrBadRequest, domain, st.domain)
	case domain == "":
		domain = st.domain
	}
	if q.s.engine.Config().Domain(domain) == nil {
		return nil, fmt.Errorf("%w %q", regional.ErrUnknownDomain, domain)
	}
	usages, err := rlqsUsages(r, q.opts.MaxBuckets)
	if err != nil {
		return nil, err
	}
	added := 0
	for _, u := range usages {
		if st.buckets[u.key] == nil {
			added++
		}
	}
	if n := len(st.buckets) + added; n > q.opts.MaxBuckets {
		return nil, fmt.Errorf("%w: the stream would track %d buckets, at most %d", ErrBadRequest, n, q.opts.MaxBuckets)
	}
	now := q.s.now()
	for i, u := range usages {
		if err := q.s.engine.ChargeReported(now, domain, u.desc, u.allowed, u.denied); err != nil {
			if i > 0 { // a reload removed the domain between two charges
				q.s.log.Debug("rlqs report charged in part", "domain", domain, "err", err)
			}
			return nil, err
		}
	}
	if st.domain == "" {
		st.domain = domain
	}
	resp := &rlqsv3.RateLimitQuotaResponse{BucketAction: make([]*rlqsv3.RateLimitQuotaResponse_BucketAction, 0, len(usages))}
	for _, u := range usages {
		q.metrics.requests.WithLabelValues(domain, "allowed").Add(float64(u.allowed))
		q.metrics.requests.WithLabelValues(domain, "denied").Add(float64(u.denied))
		b := st.buckets[u.key]
		if b == nil {
			b = &rlqsBucket{key: u.key, id: &rlqsv3.BucketId{Bucket: u.bucket}, desc: u.desc, lastActive: now}
			b.c = &consumer{s: st, b: b}
			st.buckets[u.key] = b
			q.metrics.buckets.WithLabelValues(domain).Inc()
		}
		b.lastReport = now
		if u.allowed+u.denied > 0 {
			b.lastActive = now
		}
		if u.elapsed > 0 {
			// The longest recent interval: up at once, down slowly, so
			// that a report Envoy sends early does not shorten the TTL.
			b.interval = max(u.elapsed, (4*b.interval+u.elapsed)/5)
		}
		q.book.observe(b.c, u.elapsed, float64(u.allowed+u.denied), q.opts.DemandWindow)
	}
	for _, u := range usages {
		b := st.buckets[u.key]
		if a := st.evaluate(now, b, true); a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp, nil
}

// rlqsUsages validates the usages of a report.
func rlqsUsages(r *rlqsv3.RateLimitQuotaUsageReports, maxBuckets int) ([]rlqsUsage, error) {
	us := r.GetBucketQuotaUsages()
	switch {
	case len(us) == 0:
		return nil, fmt.Errorf("%w: no bucket usages", ErrBadRequest)
	case len(us) > maxBuckets:
		return nil, fmt.Errorf("%w: %d bucket usages, at most %d", ErrBadRequest, len(us), maxBuckets)
	}
	out := make([]rlqsUsage, len(us))
	seen := make(map[string]bool, len(us))
	for i, u := range us {
		m := u.GetBucketId().GetBucket()
		switch {
		case len(m) == 0:
			return nil, fmt.Errorf("%w: usage %d: empty bucket id", ErrBadRequest, i)
		case len(m) > regional.MaxEntries:
			return nil, fmt.Errorf("%w: usage %d: bucket id has %d entries, at most %d", regional.ErrBadDescriptor, i, len(m), regional.MaxEntries)
		}
		desc := make(allot.Descriptor, 0, len(m))
		for k, v := range m {
			if k == "" || v == "" {
				return nil, fmt.Errorf("%w: usage %d: bucket id entry %q=%q is empty", regional.ErrBadDescriptor, i, k, v)
			}
			desc = append(desc, allot.Entry{Key: k, Value: v})
		}
		slices.SortFunc(desc, func(a, b allot.Entry) int { return strings.Compare(a.Key, b.Key) })
		key := bucketKey(desc)
		if seen[key] {
			return nil, fmt.Errorf("%w: usage %d: bucket %s reported twice", ErrBadRequest, i, desc)
		}
		seen[key] = true
		var elapsed time.Duration
		if te := u.GetTimeElapsed(); te != nil {
			if err := te.CheckValid(); err != nil {
				return nil, fmt.Errorf("%w: usage %d: time_elapsed: %v", ErrBadRequest, i, err)
			}
			elapsed = te.AsDuration()
		}
		if elapsed < 0 || elapsed > rlqsMaxElapsed {
			return nil, fmt.Errorf("%w: usage %d: time_elapsed %v is outside [0, %v]", ErrBadRequest, i, elapsed, rlqsMaxElapsed)
		}
		a, d := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
		if a > allot.MaxAmount || d > allot.MaxAmount {
			return nil, fmt.Errorf("%w: usage %d: %d allowed, %d denied, at most %d each", regional.ErrBadCost, i, a, d, int64(allot.MaxAmount))
		}
		out[i] = rlqsUsage{key: key, bucket: maps.Clone(m), desc: desc, elapsed: elapsed, allowed: int64(a), denied: int64(d)}
	}
	return out, nil
}

// bucketKey names a sorted descriptor unambiguously.
func bucketKey(d allot.Descriptor) string {
	var b strings.Builder
	for _, e := range d {
		b.WriteString(strconv.Itoa(len(e.Key)))
		b.WriteByte(':')
		b.WriteString(e.Key)
		b.WriteString(strconv.Itoa(len(e.Value)))
		b.WriteByte(':')
		b.WriteString(e.Value)
	}
	return b.String()
}

// refresh re-evaluates the stream's buckets: all of them on a tick (and
// forgets the stale and idle ones), else those another stream woke. It
// returns the actions worth sending.
func (st *rlqsStream) refresh(all bool) *rlqsv3.RateLimitQuotaResponse {
	if st.domain == "" {
		return nil
	}
	q := st.q
	now := q.s.now()
	var bs []*rlqsBucket
	if all {
		bs = slices.Collect(maps.Values(st.buckets))
		q.book.drain(st) // they are all evaluated
	} else {
		for _, c := range q.book.drain(st) {
			if st.buckets[c.b.key] == c.b {
				bs = append(bs, c.b)
			}
		}
	}
	slices.SortFunc(bs, func(a, b *rlqsBucket) int { return strings.Compare(a.key, b.key) })
	resp := &rlqsv3.RateLimitQuotaResponse{}
	for _, b := range bs {
		if st.buckets[b.key] != b {
			continue // woken twice
		}
		stale := now.Sub(b.lastReport) > st.ttl(b)
		idle := q.opts.IdleAfter >= 0 && now.Sub(b.lastActive) > q.opts.IdleAfter
		if all && (stale || idle) {
			resp.BucketAction = append(resp.BucketAction, st.abandon(b, now))
			continue
		}
		if a := st.evaluate(now, b, false); a != nil {
			resp.BucketAction = append(resp.BucketAction, a)
		}
	}
	return resp
}

// ttl is the assignment_time_to_live of b.
func (st *rlqsStream) ttl(b *rlqsBucket) time.Duration {
	o := &st.q.opts
	if b.interval <= 0 {
		return o.MaxTTL
	}
	return min(max(time.Duration(o.TTLFactor*float64(b.interval)), o.MinTTL), o.MaxTTL)
}

// abandon forgets b and returns its AbandonAction.
func (st *rlqsStream) abandon(b *rlqsBucket, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	st.forget(b, now)
	st.q.metrics.actions.WithLabelValues(st.domain, "abandon").Inc()
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

func (st *rlqsStream) forget(b *rlqsBucket, now time.Time) {
	st.q.book.remove(b.c, now)
	delete(st.buckets, b.key)
	st.q.metrics.buckets.WithLabelValues(st.domain).Dec()
}

// close gives back every grant of the stream.
func (st *rlqsStream) close(now time.Time) {
	for _, b := range st.buckets {
		st.forget(b, now)
	}
}

// evaluate sizes b's assignment at now. It returns the action to send:
// always one when answering a report (the assignment in force when the
// new one is not worth sending, to extend its TTL), else only a change;
// an AbandonAction when b is no longer served.
func (st *rlqsStream) evaluate(now time.Time, b *rlqsBucket, answer bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	q := st.q
	lims, err := q.s.engine.QuotaLimits(now, st.domain, b.desc, st.limits[:0])
	st.limits = lims[:0]
	if err != nil { // the domain was removed; a bucket id was validated
		return st.abandon(b, now)
	}
	matched := false
	var reqs []quotaReq
	inst := 1.0
	if q.s.enforcer != nil {
		inst = float64(max(q.s.enforcer.Instances(), 1))
	}
	for _, l := range lims {
		if l.Limit.Unit != allot.Requests {
			continue
		}
		matched = true
		if l.Limit.Shadow || l.Limit.Unlimited {
			continue
		}
		burst := l.Effective.Burst
		if l.Limit.Algorithm == allot.SlidingWindow {
			burst = l.Effective.Rate.Amount
		}
		part := l.Share / inst
		reqs = append(reqs, quotaReq{
			key:    st.domain + "\x00" + l.Key,
			amount: float64(l.Effective.Rate.Amount) * part,
			period: l.Effective.Rate.Period,
			burst:  float64(burst) * part,
		})
	}
	if !matched && b.matched {
		return st.abandon(b, now)
	}
	b.matched = matched
	ttl := st.ttl(b)
	grants := q.book.assign(b.c, reqs, now, ttl)
	next := &rlqsAssign{allow: true}
	if len(reqs) > 0 {
		next = sizeAssign(reqs, grants)
	}
	switch {
	case worthSending(b.sent, next, q.opts.Hysteresis):
		b.sent = next
	case !answer:
		return nil
	}
	q.metrics.actions.WithLabelValues(st.domain, b.sent.kind()).Inc()
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    b.sent.strategy(),
		}},
	}
}

// quotaReq is one limit key a bucket draws on, with this instance's
// allowance of it: amount per period, and burst.
type quotaReq struct {
	key    string
	amount float64
	period time.Duration
	burst  float64
}

// eps absorbs rounding in fractions that should be whole.
const eps = 1e-9

// sizeAssign turns the grants on a bucket's keys into one token bucket,
// the least of them: ⌊grant × burst⌋ tokens, refilled at the lowest
// grant × amount ÷ period; DENY_ALL below one token.
func sizeAssign(reqs []quotaReq, grants []float64) *rlqsAssign {
	tokens, rate := math.Inf(1), math.Inf(1)
	var perPeriod float64
	var period time.Duration
	for i, r := range reqs {
		g := grants[i]
		tokens = min(tokens, math.Floor(g*r.burst+eps))
		if rs := g * r.amount / r.period.Seconds(); rs < rate {
			rate, perPeriod, period = rs, g*r.amount, r.period
		}
	}
	if tokens < 1 || perPeriod <= 0 {
		return &rlqsAssign{deny: true}
	}
	a := &rlqsAssign{maxTokens: uint32(min(tokens, math.MaxUint32))}
	a.perFill, a.interval = fill(perPeriod, period)
	return a
}

// fill expresses a refill of perPeriod tokens per period (> 0) as a whole
// number of tokens per interval, never faster.
func fill(perPeriod float64, period time.Duration) (uint32, time.Duration) {
	if perPeriod < 1 { // one token per period ÷ perPeriod
		iv := math.Ceil(float64(period) / perPeriod)
		return 1, time.Duration(min(iv, float64(math.MaxInt64)))
	}
	n := math.Floor(perPeriod + eps)
	if n <= math.MaxUint32 {
		return uint32(n), period
	}
	c := math.Ceil(n / math.MaxUint32)
	return uint32(math.Floor(perPeriod / c)), time.Duration(math.Ceil(float64(period) / c))
}

// quotaBook shares the allowance of each limit key between the (stream,
// bucket) pairs that draw on it. It decides from its arguments and never
// reads the clock. Safe for concurrent use.
type quotaBook struct {
	floor float64 // RLQSOptions.Floor
	hyst  float64 // RLQSOptions.Hysteresis

	mu   sync.Mutex
	keys map[string]*keyBook // by domain + "\x00" + KeyString
}

// keyBook is one limit key's pairs.
type keyBook struct {
	parts map[*consumer]*part
	unit  float64 // one token of the burst, as a fraction of it
}

// part is one pair's grant on a key.
type part struct {
	granted float64   // fraction of the key's allowance
	until   time.Time // when the grant lapses unless renewed
}

// consumer is one (stream, bucket) pair in the book. s and b are fixed;
// the other fields are guarded by the book's lock.
type consumer struct {
	s        *rlqsStream
	b        *rlqsBucket
	demand   float64 // requests per second, smoothed
	measured bool    // demand has been measured
	keys     []string
	dirty    bool // on s.dirty
}

func newQuotaBook(floor, hyst float64) *quotaBook {
	return &quotaBook{floor: floor, hyst: hyst, keys: make(map[string]*keyBook)}
}

// observe adds a report of n requests over elapsed to c's demand.
func (qb *quotaBook) observe(c *consumer, elapsed time.Duration, n float64, window time.Duration) {
	if elapsed <= 0 {
		return // Envoy's first report of a bucket: no interval yet
	}
	x := n / elapsed.Seconds()
	qb.mu.Lock()
	defer qb.mu.Unlock()
	if !c.measured {
		c.demand, c.measured = x, true
		return
	}
	c.demand += min(1, float64(elapsed)/float64(window)) * (x - c.demand)
}

// targets returns each pair's target fraction of the key.
func (kb *keyBook) targets(floor float64) map[*consumer]float64 {
	n := float64(len(kb.parts))
	var sum, measured float64
	for c := range kb.parts {
		if c.measured {
			sum += c.demand
			measured++
		}
	}
	mean := 0.0
	if measured > 0 {
		mean = sum / measured
	}
	demand := func(c *consumer) float64 {
		if c.measured {
			return c.demand
		}
		return mean
	}
	total := sum + (n-measured)*mean
	out := make(map[*consumer]float64, len(kb.parts))
	for c := range kb.parts {
		f := 1 / n
		if total > 0 {
			f = (1-floor)*demand(c)/total + floor/n
		}
		out[c] = min(max(f, kb.unit), 1)
	}
	return out
}

// short reports whether c, holding held, is short of its target by more
// than the hysteresis.
func (kb *keyBook) short(c *consumer, held float64, tg map[*consumer]float64, hyst float64) bool {
	return held < tg[c]*(1-hyst)-eps
}

// inForce is p's grant at now: nothing once it has lapsed.
func (p *part) inForce(now time.Time) float64 {
	if now.After(p.until) {
		return 0
	}
	return p.granted
}

// assign makes c draw on exactly the keys of reqs and grants it its part
// of each, in force until now+ttl: its target, or what the other pairs
// leave when less. It wakes the streams whose grants should change as a
// result.
func (qb *quotaBook) assign(c *consumer, reqs []quotaReq, now time.Time, ttl time.Duration) []float64 {
	qb.mu.Lock()
	defer qb.mu.Unlock()
	for _, k := range c.keys {
		if !slices.ContainsFunc(reqs, func(r quotaReq) bool { return r.key == k }) {
			qb.leave(c, k, now)
		}
	}
	c.keys = c.keys[:0]
	grants := make([]float64, len(reqs))
	for i, r := range reqs {
		c.keys = append(c.keys, r.key)
		kb := qb.keys[r.key]
		if kb == nil {
			kb = &keyBook{parts: make(map[*consumer]*part)}
			qb.keys[r.key] = kb
		}
		kb.unit = 1
		if r.burst > 1 {
			kb.unit = 1 / r.burst
		}
		p := kb.parts[c]
		if p == nil {
			p = &part{}
			kb.parts[c] = p
		}
		tg := kb.targets(qb.floor)
		others, short := 0.0, false
		for o, op := range kb.parts {
			if o != c {
				held := op.inForce(now)
				others += held
				short = short || kb.short(o, held, tg, qb.hyst)
			}
		}
		free := max(1-others, 0)
		old := p.inForce(now)
		g := min(tg[c], free)
		if old > g && old <= g*(1+qb.hyst)+eps && old <= free+eps && !short {
			g = old // a small decrease that no one needs: not worth a new bucket at the Envoy
		}
		p.granted, p.until = g, now.Add(ttl)
		grants[i] = g
		for o, op := range kb.parts {
			if o == c {
				continue
			}
			held := op.inForce(now)
			if kb.short(c, g, tg, qb.hyst) && held > tg[o]+eps || // c is short: o holds more than its target
				g < old-eps && kb.short(o, held, tg, qb.hyst) { // c gave some back: o is short
				qb.wake(o)
			}
		}
	}
	return grants
}

// leave removes c from key k and wakes the pairs that are now short.
// The caller holds qb.mu.
func (qb *quotaBook) leave(c *consumer, k string, now time.Time) {
	kb := qb.keys[k]
	if kb == nil {
		return
	}
	p := kb.parts[c]
	delete(kb.parts, c)
	if len(kb.parts) == 0 {
		delete(qb.keys, k)
		return
	}
	if p == nil || p.inForce(now) == 0 {
		return
	}
	tg := kb.targets(qb.floor)
	for o, op := range kb.parts {
		if kb.short(o, op.inForce(now), tg, qb.hyst) {
			qb.wake(o)
		}
	}
}

// remove takes c out of the book.
func (qb *quotaBook) remove(c *consumer, now time.Time) {
	qb.mu.Lock()
	defer qb.mu.Unlock()
	for _, k := range c.keys {
		qb.leave(c, k, now)
	}
	c.keys = nil
}

// wake marks c for re-evaluation and signals its stream. The caller holds
// qb.mu.
func (qb *quotaBook) wake(c *consumer) {
	if c.dirty {
		return
	}
	c.dirty = true
	c.s.dirty = append(c.s.dirty, c)
	select {
	case c.s.wake <- struct{}{}:
	default:
	}
}

// drain returns and clears the consumers of s to re-evaluate.
func (qb *quotaBook) drain(s *rlqsStream) []*consumer {
	qb.mu.Lock()
	defer qb.mu.Unlock()
	out := s.dirty
	s.dirty = nil
	for _, c := range out {
		c.dirty = false
	}
	return out
}

// grantSum is the sum of the grants in force on key k at now (tests).
func (qb *quotaBook) grantSum(k string, now time.Time) (sum float64, pairs int) {
	qb.mu.Lock()
	defer qb.mu.Unlock()
	kb := qb.keys[k]
	if kb == nil {
		return 0, 0
	}
	for _, p := range kb.parts {
		sum += p.inForce(now)
	}
	return sum, len(kb.parts)
}

// rlqsMetrics are the service's allot_regional_rlqs_* series. The domain
// label takes configured domains only: a stream's domain is checked
// before it is counted.
type rlqsMetrics struct {
	streams  prometheus.Gauge
	buckets  *prometheus.GaugeVec   // domain
	requests *prometheus.CounterVec // domain, result
	actions  *prometheus.CounterVec // domain, action
	errors   *prometheus.CounterVec // reason
}

func newRLQSMetrics(reg prometheus.Registerer) *rlqsMetrics {
	m := &rlqsMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allot_regional_rlqs_streams",
			Help: "Open rate limit quota streams (Envoys).",
		}),
		buckets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_regional_rlqs_buckets",
			Help: "Buckets tracked over all rate limit quota streams.",
		}, []string{"domain"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_rlqs_requests_total",
			Help: "Requests Envoys reported deciding themselves, by result (allowed, denied).",
		}, []string{"domain", "result"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_rlqs_actions_total",
			Help: "Bucket actions sent to Envoys: token_bucket, allow_all, deny_all assignments and abandon.",
		}, []string{"domain", "action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_rlqs_stream_errors_total",
			Help: "Rate limit quota streams closed for bad reports, by reason; nothing was charged.",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.buckets, m.requests, m.actions, m.errors)
	}
	return m
}

var _ rlqsv3.RateLimitQuotaServiceServer = (*RLQS)(nil)
