package peersync

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Syncer's series (allot_peer_*). Labels are bounded:
// peer regions and limit names come from the configuration; keys never
// appear (the top-K estimates are labelled by rank).
type metrics struct {
	connected  *prometheus.GaugeVec   // peer
	lag        *prometheus.GaugeVec   // peer
	messages   *prometheus.CounterVec // peer, direction
	batches    *prometheus.CounterVec // peer, direction
	bytes      *prometheus.CounterVec // peer, direction
	dropped    *prometheus.CounterVec // peer
	resyncs    *prometheus.CounterVec // peer, direction
	rejections *prometheus.CounterVec // reason
	loanCalls  *prometheus.CounterVec // peer, result

	mu    sync.Mutex
	delay map[string]float64 // peer → EWMA of the one-way delay (seconds)
}

func newMetrics(s *Syncer, reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_peer_connected", Help: "1 while this instance's Sync stream to the peer region is up.",
		}, []string{"peer"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_peer_sync_lag_seconds", Help: "Age of the latest message received from the peer region when it arrived (its clock against ours).",
		}, []string{"peer"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_messages_total", Help: "Sync messages sent to and received from peer regions, heartbeats included.",
		}, []string{"peer", "direction"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_delta_batches_total", Help: "Delta batches (one per limit) sent to and received from peer regions.",
		}, []string{"peer", "direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_delta_bytes_total", Help: "Encoded delta bytes sent to and received from peer regions.",
		}, []string{"peer", "direction"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_dropped_messages_total", Help: "Messages to a peer dropped because its queue was full; the peer resyncs.",
		}, []string{"peer"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_resyncs_total", Help: "Full-state resyncs: requested from a peer (it lost deltas) or served to one.",
		}, []string{"peer", "direction"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_rejections_total", Help: "Messages and loan asks from peers refused as bad input, by reason.",
		}, []string{"reason"}),
		loanCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_peer_lend_calls_total", Help: "Lend calls to peer regions, by result (granted, refused, error).",
		}, []string{"peer", "result"}),
		delay: map[string]float64{},
	}
	if reg != nil {
		reg.MustRegister(m.connected, m.lag, m.messages, m.batches, m.bytes, m.dropped, m.resyncs, m.rejections, m.loanCalls,
			&engineCollector{s: s, m: m})
	}
	return m
}

// observeLag records the age of a message from peer sent at sent.
func (m *metrics) observeLag(peer string, sent, now time.Time) {
	if sent.IsZero() {
		return
	}
	d := max(now.Sub(sent), 0).Seconds()
	m.lag.WithLabelValues(peer).Set(d)
	m.mu.Lock()
	if old, ok := m.delay[peer]; ok {
		d = 0.9*old + 0.1*d
	}
	m.delay[peer] = d
	m.mu.Unlock()
}

// maxDelay is the largest observed one-way delay to a peer.
func (m *metrics) maxDelay() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := 0.0
	for _, v := range m.delay {
		d = max(d, v)
	}
	return time.Duration(d * float64(time.Second))
}

// engineCollector exports the engine's per-limit sync counters.
type engineCollector struct {
	s *Syncer
	m *metrics
}

var (
	fallbackDesc = prometheus.NewDesc("allot_peer_fallback_active",
		"1 while a peer of a shared-mode limit is stale: the limit is enforced at the region's split share.", []string{"domain", "limit"}, nil)
	fallbacksDesc = prometheus.NewDesc("allot_peer_stale_fallbacks_total",
		"Times a shared-mode limit fell back to the split share because a peer went stale.", []string{"domain", "limit"}, nil)
	fallbackDecDesc = prometheus.NewDesc("allot_peer_fallback_decisions_total",
		"Shared-mode decisions made at the split share while a peer was stale.", []string{"domain", "limit"}, nil)
	boundDesc = prometheus.NewDesc("allot_peer_overshoot_bound",
		"Most a shared-mode limit may admit above its amount in a window, bursts included (allot.SharedBound, for the observed delay): (regions − 1) × max(rate × 2 × sync interval, 5% of the amount) × max(1, ceil(delay / sync interval)).", []string{"domain", "limit"}, nil)
	estimateDesc = prometheus.NewDesc("allot_peer_overshoot_estimate_ratio",
		"For the heaviest keys of a shared-mode limit in the last complete window, by rank: the global total known here above the key's limit, as a fraction of it.", []string{"domain", "limit", "rank"}, nil)
	deltasDesc = prometheus.NewDesc("allot_peer_deltas_total",
		"Deltas of a shared-mode limit sent (once per tick, to every peer) and received.", []string{"domain", "limit", "direction"}, nil)
	gapsDesc = prometheus.NewDesc("allot_peer_sequence_gaps_total",
		"Gaps seen in peers' sequence numbers: deltas lost, a resync asked.", []string{"domain", "limit"}, nil)
	loansDesc = prometheus.NewDesc("allot_peer_loans_total",
		"Loans of split-mode allowance: asked, granted, refused, failed, expired (here), lent and lend_refused (to peers).", []string{"domain", "limit", "result"}, nil)
	loanTokensDesc = prometheus.NewDesc("allot_peer_loan_tokens_total",
		"Allowance moved by loans: borrowed (credited here) and lent (deducted here).", []string{"domain", "limit", "direction"}, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fallbackDesc, fallbacksDesc, fallbackDecDesc, boundDesc, estimateDesc, deltasDesc, gapsDesc, loansDesc, loanTokensDesc} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	delay := c.m.maxDelay()
	for _, st := range c.s.opts.Engine.SyncStats() {
		l := []string{st.Domain, st.Limit}
		counter := func(d *prometheus.Desc, v uint64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(l, extra...)...)
		}
		if st.Shared {
			active := 0.0
			if st.Fallback {
				active = 1
			}
			ch <- prometheus.MustNewConstMetric(fallbackDesc, prometheus.GaugeValue, active, l...)
			counter(fallbacksDesc, st.Fallbacks)
			counter(fallbackDecDesc, st.FallbackDecisions)
			ch <- prometheus.MustNewConstMetric(boundDesc, prometheus.GaugeValue, st.OvershootBound(delay), l...)
			for i, k := range st.TopK {
				ratio := 0.0
				if k.Limit > 0 {
					ratio = k.Overshoot() / k.Limit
				}
				ch <- prometheus.MustNewConstMetric(estimateDesc, prometheus.GaugeValue, ratio, st.Domain, st.Limit, strconv.Itoa(i+1))
			}
			counter(deltasDesc, st.DeltasOut, "out")
			counter(deltasDesc, st.DeltasIn, "in")
			counter(gapsDesc, st.Gaps)
		}
		if st.Borrow {
			counter(loansDesc, st.LoansAsked, "asked")
			counter(loansDesc, st.LoansGranted, "granted")
			counter(loansDesc, st.LoansRefused, "refused")
			counter(loansDesc, st.LoansFailed, "failed")
			counter(loansDesc, st.LoansExpired, "expired")
			counter(loansDesc, st.LoansMade, "lent")
			counter(loansDesc, st.LendRefused, "lend_refused")
			counter(loanTokensDesc, st.Borrowed, "borrowed")
			counter(loanTokensDesc, st.Lent, "lent")
		}
	}
}
