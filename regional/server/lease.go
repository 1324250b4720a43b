package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/allot-dev/allot/regional"
)

// DefaultLeaseTTL is how long a gateway may spend a grant when
// Options.LeaseTTL is 0.
const DefaultLeaseTTL = time.Second

// maxGateways bounds the gateway ids an enforcer remembers; ids beyond it
// are served but not counted until older ones expire.
const maxGateways = 100_000

// leases serves the Lease RPC: grants charged to the region's allowance
// when made, returns refunded, and the gateways of the region counted.
//
// The bound a gateway fleet keeps: every granted token was charged here,
// so over any interval of length T the tokens spent by all gateways are at
// most what this enforcer admits over [start−TTL, end] — for a token
// bucket, the region's burst + rate × (T + TTL). A return gives back only
// what the gateway did not spend, and a token bucket refund never lifts
// the state above what it would be had the tokens never been charged; a
// return into a sliding window other than the grant's is dropped, since
// its charge has moved to the previous window's weight. A report lost or
// late strands its tokens (they stay charged) and never adds any.
type leases struct {
	s   *Service
	ttl time.Duration

	mu       sync.Mutex
	gateways map[string]time.Time // id → last heard
	pruned   time.Time            // the last sweep of gateways not heard within the TTL

	calls  prometheus.Counter
	tokens *prometheus.CounterVec // kind: granted, returned, dropped, used
}

func newLeases(s *Service, ttl time.Duration, reg prometheus.Registerer) *leases {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	l := &leases{s: s, ttl: ttl, gateways: make(map[string]time.Time)}
	l.calls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_regional_gateway_lease_calls_total",
		Help: "Lease calls from gateways that decide in their own process.",
	})
	l.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_regional_gateway_lease_tokens_total",
		Help: "Tokens leased to gateways, by kind: granted (charged), returned (refunded), dropped (returned into a past window, kept charged), used (reported spent).",
	}, []string{"kind"})
	if reg != nil {
		reg.MustRegister(l.calls, l.tokens, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_regional_gateways",
			Help: "Gateways heard within the lease TTL.",
		}, func() float64 { return float64(l.count(s.now(), "", false)) }))
	}
	return l
}

// count records id (unless empty), forgets ids not heard within the TTL
// (swept every quarter TTL) and id itself when leaving, and returns the
// number of live gateways.
func (l *leases) count(now time.Time, id string, leaving bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case id == "":
	case leaving:
		delete(l.gateways, id)
	case len(l.gateways) < maxGateways:
		l.gateways[id] = now
	default:
		if _, ok := l.gateways[id]; ok {
			l.gateways[id] = now
		}
	}
	// Sweeping every call would cost a pass over every gateway per call;
	// every quarter TTL, a silent gateway is counted at most 1.25 TTL.
	if now.Sub(l.pruned) >= l.ttl/4 {
		l.pruned = now
		for g, at := range l.gateways {
			if now.Sub(at) > l.ttl {
				delete(l.gateways, g)
			}
		}
	}
	return len(l.gateways)
}

// leaseItem is one item of a Lease call, decoded.
type leaseItem struct {
	CheckItem
	want, returned, used int64
	grantedAt            time.Time
}

func decodeLease(req *allotv1.LeaseRequest) ([]leaseItem, error) {
	if len(req.GetGatewayId()) > 256 {
		return nil, fmt.Errorf("%w: gateway_id longer than 256 bytes", ErrBadRequest)
	}
	items := make([]leaseItem, len(req.GetItems()))
	for i, it := range req.GetItems() {
		li := leaseItem{
			CheckItem: CheckItem{Domain: it.GetDomain(), Descriptors: descriptors(it.GetDescriptors())},
			want:      it.GetWant(),
			returned:  it.GetReturned(),
			used:      it.GetUsed(),
			grantedAt: time.Unix(0, it.GetReturnedGrantedAtUnixNano()),
		}
		for _, n := range [...]struct {
			name string
			v    int64
		}{{"want", li.want}, {"returned", li.returned}, {"used", li.used}} {
			if n.v < 0 || n.v > allot.MaxAmount {
				return nil, fmt.Errorf("item %d: %w: %s %d is outside [0, %d]", i, regional.ErrBadCost, n.name, n.v, int64(allot.MaxAmount))
			}
		}
		if li.returned > 0 && it.GetReturnedGrantedAtUnixNano() <= 0 {
			return nil, fmt.Errorf("item %d: %w: returned tokens without returned_granted_at_unix_nano", i, ErrBadRequest)
		}
		items[i] = li
	}
	return items, nil
}

// serve answers one Lease call. Every item is validated before anything
// is charged or refunded.
func (l *leases) serve(ctx context.Context, req *allotv1.LeaseRequest) (*allotv1.LeaseResponse, error) {
	items, err := decodeLease(req)
	if err != nil {
		return nil, err
	}
	if len(items) > l.s.maxBatch {
		return nil, fmt.Errorf("%w: %d items, at most %d", ErrBadRequest, len(items), l.s.maxBatch)
	}
	now := l.s.now()
	for i, it := range items {
		probe := it.CheckItem
		probe.Hits = 0
		if err := l.s.validate(now, probe, true); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
	}
	l.calls.Inc()
	resp := &allotv1.LeaseResponse{
		Gateways: int32(max(1, l.count(now, req.GetGatewayId(), req.GetLeaving()))),
		Ttl:      durationpb.New(l.ttl),
		Grants:   make([]*allotv1.LeaseGrant, len(items)),
	}
	for i := range items {
		g, err := l.grant(ctx, now, &items[i])
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		resp.Grants[i] = g
	}
	return resp, nil
}

// grant takes one item's return, then sizes and charges its new lease.
func (l *leases) grant(ctx context.Context, now time.Time, it *leaseItem) (*allotv1.LeaseGrant, error) {
	var dec allot.Decision
	var inline [4]regional.Item
	probe := it.CheckItem
	probe.Hits = 0
	if err := l.s.checkItems(ctx, now, it.Domain, engineItems(probe, inline[:0]), &dec); err != nil {
		return nil, err
	}
	dom := l.s.engine.Config().Domain(it.Domain)
	g := &allotv1.LeaseGrant{GrantedAtUnixNano: now.UnixNano()}
	sameWindow := true
	for _, st := range dec.Statuses {
		lim := dom.Limit(st.Name)
		if lim == nil {
			continue
		}
		if lim.Enforcement == allot.Exact {
			g.CheckEach = true
		}
		if lim.Algorithm == allot.SlidingWindow && st.Window > 0 &&
			now.UnixNano()/int64(st.Window) != it.grantedAt.UnixNano()/int64(st.Window) {
			sameWindow = false
		}
		share := l.s.engine.Share(it.Domain, lim.Name, regional.KeyString(lim, it.Descriptors[st.Descriptor]))
		g.Fallback = append(g.Fallback, &allotv1.LeaseFallback{
			Name:         lim.Name,
			OnFailure:    lim.OnFailure.String(),
			RegionAmount: float64(st.Limit) * share,
			Window:       durationpb.New(st.Window),
		})
	}
	if it.used > 0 {
		l.tokens.WithLabelValues("used").Add(float64(it.used))
	}
	if it.returned > 0 {
		if !sameWindow {
			l.tokens.WithLabelValues("dropped").Add(float64(it.returned))
		} else {
			ri := it.CheckItem
			ri.Hits = it.returned
			if err := l.s.refundItems(ctx, now, it.Domain, engineItems(ri, inline[:0]), &dec); err != nil {
				return nil, err
			}
			l.tokens.WithLabelValues("returned").Add(float64(it.returned))
		}
	}
	if it.want == 0 || g.CheckEach {
		g.Limits = l.s.headedResult(it.Domain, it.Descriptors, &dec).Limits
		return g, nil
	}
	// Size by the most restrictive limit's remaining.
	n := regional.GatewayGrant(it.want, regional.GatewayLeft(&dec))
	if n > 0 {
		ci := it.CheckItem
		ci.Hits = n
		if err := l.s.checkItems(ctx, now, ci.Domain, engineItems(ci, inline[:0]), &dec); err != nil {
			return nil, err
		}
		if dec.Allowed {
			g.Granted = n
			l.tokens.WithLabelValues("granted").Add(float64(n))
		}
	}
	if g.Granted < it.want {
		g.RetryAfter = durationpb.New(regional.GatewayRetryAfter(&dec))
	}
	g.Limits = l.s.headedResult(it.Domain, it.Descriptors, &dec).Limits
	return g, nil
}
