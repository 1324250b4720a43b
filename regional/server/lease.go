package server

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
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

// DefaultMaxLeaseGrants bounds the grants a Service remembers for their
// returns when Options.MaxLeaseGrants is 0.
const DefaultMaxLeaseGrants = 1 << 20

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
//
// A return gives back at most what its caller was granted and has not
// returned (grants): a return names its grant, and is refunded up to
// what is left of the grant that caller received for that item at that
// instant; the rest is refused — not refunded, counted as kind
// "refused" — and the call goes on. Refusing only the excess, rather
// than failing the call, is what a gateway needs: a return to another
// instance than the grant's, or after a restart, is a return this
// instance never granted, and failing would also refuse the new grant
// the call asks for. Its tokens stay charged, as a lost report's.
type leases struct {
	s   *Service
	ttl time.Duration

	mu       sync.Mutex
	gateways map[string]time.Time // id → last heard
	pruned   time.Time            // the last sweep of gateways not heard within the TTL

	grants grants // what each caller may still return; guarded by mu

	calls  prometheus.Counter
	tokens *prometheus.CounterVec // kind: granted, returned, dropped, used, refused
}

// grantID names one grant of one item to one caller: a hash of the
// caller's identity, its gateway id, the item's domain and descriptors,
// and the grant's instant.
type grantID [sha256.Size]byte

// grants remembers what each grant may still give back, for 2 TTLs after
// it was made (a gateway returns a grant before it ends, a TTL after),
// and at most max of them: a grant made when max are held is not
// remembered, and its tokens cannot come back. Not safe for concurrent
// use; leases.mu guards it.
type grants struct {
	max   int
	left  map[grantID]int64 // tokens that may still come back
	order []grantExpiry     // in the order made, to forget expired ones
}

type grantExpiry struct {
	id  grantID
	end time.Time
}

func newGrantID(caller, gateway string, it *CheckItem, at int64) grantID {
	h := sha256.New()
	var b [8]byte
	field := func(s string) {
		binary.BigEndian.PutUint64(b[:], uint64(len(s)))
		h.Write(b[:])
		h.Write([]byte(s))
	}
	field(caller)
	field(gateway)
	field(it.Domain)
	for _, d := range it.Descriptors {
		binary.BigEndian.PutUint64(b[:], uint64(len(d)))
		h.Write(b[:])
		for _, e := range d {
			field(e.Key)
			field(e.Value)
		}
	}
	binary.BigEndian.PutUint64(b[:], uint64(at))
	h.Write(b[:])
	var id grantID
	h.Sum(id[:0])
	return id
}

// expire forgets grants whose 2 TTLs have passed.
func (g *grants) expire(now time.Time) {
	i := 0
	for ; i < len(g.order) && !now.Before(g.order[i].end); i++ {
		delete(g.left, g.order[i].id)
	}
	if i > 0 {
		g.order = append(g.order[:0], g.order[i:]...)
	}
}

// add remembers n more tokens of grant id, ending at end.
func (g *grants) add(id grantID, n int64, end time.Time) {
	if _, ok := g.left[id]; ok {
		g.left[id] += n
		return
	}
	if len(g.left) >= g.max {
		return
	}
	g.left[id] = n
	g.order = append(g.order, grantExpiry{id, end})
}

// take takes up to n tokens of grant id and returns how many.
func (g *grants) take(id grantID, n int64) int64 {
	left := g.left[id]
	n = min(n, left)
	if n > 0 {
		g.left[id] = left - n
	}
	return n
}

func newLeases(s *Service, ttl time.Duration, maxGrants int, reg prometheus.Registerer) *leases {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	if maxGrants <= 0 {
		maxGrants = DefaultMaxLeaseGrants
	}
	l := &leases{s: s, ttl: ttl, gateways: make(map[string]time.Time), grants: grants{max: maxGrants, left: make(map[grantID]int64)}}
	l.calls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "allot_regional_gateway_lease_calls_total",
		Help: "Lease calls from gateways that decide in their own process.",
	})
	l.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_regional_gateway_lease_tokens_total",
		Help: "Tokens leased to gateways, by kind: granted (charged), returned (refunded), dropped (returned into a past window, kept charged), used (reported spent), refused (returned beyond what the caller was granted and had not returned, kept charged).",
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
	caller := l.s.caller(ctx).Identity.URI // "": every anonymous caller
	for i := range items {
		g, err := l.grant(ctx, now, caller, req.GetGatewayId(), &items[i])
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		resp.Grants[i] = g
	}
	return resp, nil
}

// take takes up to n tokens of the grant id, after forgetting expired
// grants, and returns how many it may give back.
func (l *leases) take(now time.Time, id grantID, n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants.expire(now)
	return l.grants.take(id, n)
}

// granted remembers a grant of n tokens made at now.
func (l *leases) granted(now time.Time, id grantID, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants.expire(now)
	l.grants.add(id, n, now.Add(2*l.ttl))
}

// grant takes one item's return, then sizes and charges its new lease,
// for caller (an identity's URI; "" for anonymous callers) with the
// gateway id it declares.
func (l *leases) grant(ctx context.Context, now time.Time, caller, gateway string, it *leaseItem) (*allotv1.LeaseGrant, error) {
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
		id := newGrantID(caller, gateway, &it.CheckItem, it.grantedAt.UnixNano())
		back := l.take(now, id, it.returned)
		if refused := it.returned - back; refused > 0 {
			l.tokens.WithLabelValues("refused").Add(float64(refused))
			l.s.log.Debug("lease return beyond the grant refused", "domain", it.Domain, "returned", it.returned, "refused", refused)
		}
		switch {
		case back == 0:
		case !sameWindow:
			l.tokens.WithLabelValues("dropped").Add(float64(back))
		default:
			ri := it.CheckItem
			ri.Hits = back
			if err := l.s.refundItems(ctx, now, it.Domain, engineItems(ri, inline[:0]), &dec); err != nil {
				l.granted(it.grantedAt, id, back) // not refunded: it may come back again
				return nil, err
			}
			l.tokens.WithLabelValues("returned").Add(float64(back))
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
			l.granted(now, newGrantID(caller, gateway, &it.CheckItem, g.GrantedAtUnixNano), n)
		}
	}
	if g.Granted < it.want {
		g.RetryAfter = durationpb.New(regional.GatewayRetryAfter(&dec))
	}
	g.Limits = l.s.headedResult(it.Domain, it.Descriptors, &dec).Limits
	return g, nil
}
