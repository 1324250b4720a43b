package demo

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// callTimeout bounds every call the traffic makes.
const callTimeout = 2 * time.Second

// maxInFlight bounds the calls in flight (reservations held included);
// past it, due requests are dropped and counted.
const maxInFlight = 1024

// traffic plays a chapter's flows against the regions' RateLimiter:
// every tick it sends, per region, one Check batch with the requests due
// and one Reserve per token reservation due, and counts every decision
// in a Tally. tick is not safe for concurrent use (one driver calls it);
// the calls it starts run concurrently.
type traffic struct {
	regions []string
	clients map[string]allotv1.RateLimiterClient
	tally   *Tally
	rnd     *rand.Rand
	log     *slog.Logger

	pacers map[[2]string]*pacer // region, flow name
	next   map[string]int       // flow name → next spread key
	sem    chan struct{}
	wg     sync.WaitGroup

	dropped atomic.Uint64 // requests not sent: too many in flight
	failed  atomic.Uint64 // calls that returned an error
}

func newTraffic(regions []string, clients map[string]allotv1.RateLimiterClient, tally *Tally, rnd *rand.Rand, log *slog.Logger) *traffic {
	return &traffic{regions: regions, clients: clients, tally: tally, rnd: rnd, log: log,
		pacers: map[[2]string]*pacer{}, next: map[string]int{}, sem: make(chan struct{}, maxInFlight)}
}

// tick sends what ch's flows make due over dt.
func (t *traffic) tick(ctx context.Context, ch *Chapter, dt time.Duration) {
	for _, region := range t.regions {
		var items []*allotv1.CheckItem
		var infos []itemInfo
		for fi, f := range ch.Flows {
			p := t.pacers[[2]string{region, f.Name}]
			if p == nil {
				p = &pacer{}
				t.pacers[[2]string{region, f.Name}] = p
			}
			n := p.take(f.Rates[region], dt)
			for range n {
				desc := t.descriptor(f)
				if f.LLM != nil {
					t.reserve(ctx, region, f, desc)
					continue
				}
				items = append(items, &allotv1.CheckItem{Domain: f.Domain, Descriptors: []*allotv1.Descriptor{desc}})
				infos = append(infos, itemInfo{domain: f.Domain, flow: &ch.Flows[fi]})
			}
		}
		if len(items) > 0 {
			t.check(ctx, region, items, infos)
		}
	}
}

// descriptor is f's descriptor for its next request.
func (t *traffic) descriptor(f Flow) *allotv1.Descriptor {
	d := &allotv1.Descriptor{Entries: make([]*allotv1.Entry, len(f.Descriptor))}
	k := 0
	if f.Spread != "" {
		k = t.next[f.Name]%max(f.Keys, 1) + 1
		t.next[f.Name]++
	}
	for i, e := range f.Descriptor {
		v := e.Value
		if e.Key == f.Spread && k > 0 {
			v += strconv.Itoa(k)
		}
		d.Entries[i] = &allotv1.Entry{Key: e.Key, Value: v}
	}
	return d
}

// acquire takes an in-flight slot, or counts the request dropped.
func (t *traffic) acquire(n int) bool {
	select {
	case t.sem <- struct{}{}:
		t.wg.Add(1)
		return true
	default:
		t.dropped.Add(uint64(n))
		return false
	}
}

func (t *traffic) release() {
	<-t.sem
	t.wg.Done()
}

// itemInfo says where a Check item comes from.
type itemInfo struct {
	domain string
	flow   *Flow
}

// check sends one batch to region and counts its decisions.
func (t *traffic) check(ctx context.Context, region string, items []*allotv1.CheckItem, infos []itemInfo) {
	if !t.acquire(len(items)) {
		return
	}
	go func() {
		defer t.release()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		resp, err := t.clients[region].Check(cctx, &allotv1.CheckRequest{Items: items})
		if err != nil {
			t.fail(region, "check", err)
			return
		}
		for i, res := range resp.GetResults() {
			if i < len(infos) {
				t.count(region, *infos[i].flow, res.GetLimits())
			}
		}
	}()
}

// reserve holds a token reservation in region, streams for f's hold and
// settles it with the real usage; on shutdown it settles at once.
func (t *traffic) reserve(ctx context.Context, region string, f Flow, desc *allotv1.Descriptor) {
	llm := *f.LLM
	out := llm.OutMin
	if llm.OutMax > llm.OutMin {
		out += t.rnd.Int64N(llm.OutMax - llm.OutMin + 1)
	}
	if !t.acquire(1) {
		return
	}
	go func() {
		defer t.release()
		// Not cancelled with the demo: a Reserve the enforcer completed
		// after the demo stopped waiting would stay held until its TTL.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		resp, err := t.clients[region].Reserve(cctx, &allotv1.ReserveRequest{Domain: f.Domain, Descriptors: []*allotv1.Descriptor{desc},
			PromptTokens: llm.PromptTokens, MaxTokens: llm.MaxTokens, Model: llm.Model})
		cancel()
		if err != nil {
			t.fail(region, "reserve", err)
			return
		}
		t.count(region, f, resp.GetLimits())
		if !resp.GetAllowed() {
			return
		}
		hold := time.NewTimer(llm.Hold)
		select {
		case <-hold.C:
		case <-ctx.Done():
			hold.Stop()
		}
		// Settle even when the demo stops: nothing is left to expire.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		if _, err := t.clients[region].Settle(sctx, &allotv1.SettleRequest{ReservationId: resp.GetReservationId(),
			InputTokens: llm.PromptTokens, OutputTokens: out}); err != nil {
			t.fail(region, "settle", err)
		}
	}()
}

// count tallies one answer to flow f's request per limit, as the
// enforcer's metrics do, and per key row when f is watched; a shadow
// limit's would-be rejection admits. (A concurrency cap's rejection
// shows on its limit's status.)
func (t *traffic) count(region string, f Flow, limits []*allotv1.LimitStatus) {
	for _, st := range limits {
		name, ok := f.Domain+"/"+st.GetName(), st.GetAllowed() || st.GetShadow()
		t.tally.Add(region, name, ok)
		if f.Watch {
			t.tally.Add(region, KeyRow(name, f.Descriptor), ok)
		}
	}
}

func (t *traffic) fail(region, call string, err error) {
	if t.failed.Add(1)%100 == 1 {
		t.log.Warn("demo traffic: call failed", "region", region, "call", call, "failed", t.failed.Load(), "err", err)
	}
}

// wait waits for every call in flight, reservations settled.
func (t *traffic) wait() { t.wg.Wait() }
