package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot"
	"github.com/allot-dev/allot/regional"
)

// metrics are the service's Prometheus series. Labels are bounded: domain
// and limit names come from the configuration, never from requests (a
// request for an unknown domain is counted as an error, not as a domain).
type metrics struct {
	decisions *prometheus.CounterVec   // domain, limit, result, enforcement
	shadow    *prometheus.CounterVec   // domain, limit
	errors    *prometheus.CounterVec   // reason
	latency   prometheus.Histogram     // seconds per decision
	known     atomic.Pointer[knownSet] // domains and limits of the config in force
}

type knownSet struct {
	enforcement map[[2]string]string // (domain, limit) → enforcement
}

func newMetrics(e *regional.Engine, f *regional.Enforcer, region string, reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_decisions_total",
			Help: "Decisions per matching limit, by result (allowed, rejected, shadow_rejected).",
		}, []string{"domain", "limit", "result", "enforcement"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_shadow_rejections_total",
			Help: "Requests a shadow-mode limit would have rejected (they were allowed).",
		}, []string{"domain", "limit"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_check_errors_total",
			Help: "Checks refused as bad input, by reason; nothing was charged.",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_regional_decision_duration_seconds",
			Help:    "Time the engine takes to decide one item.",
			Buckets: prometheus.ExponentialBuckets(100e-9, 4, 10), // 100ns … 26ms
		}),
	}
	m.configLoaded(e.Config())
	if reg == nil {
		return m
	}
	if f != nil {
		reg.MustRegister(newEnforcerCollector(f, region))
	}
	reg.MustRegister(m.decisions, m.shadow, m.errors, m.latency,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "allot_regional_evictions_total",
			Help:        "Keys dropped from the key table because their state was full again (idle) or to respect the key bound (active).",
			ConstLabels: prometheus.Labels{"kind": "idle"},
		}, func() float64 { return float64(e.Stats().EvictedIdle) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "allot_regional_evictions_total",
			Help:        "Keys dropped from the key table because their state was full again (idle) or to respect the key bound (active).",
			ConstLabels: prometheus.Labels{"kind": "active"},
		}, func() float64 { return float64(e.Stats().EvictedActive) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_regional_keys",
			Help: "Keys tracked in the engine's key table.",
		}, func() float64 { return float64(e.Stats().Keys) }),
	)
	return m
}

func (m *metrics) configLoaded(cfg *allot.Config) {
	k := &knownSet{enforcement: make(map[[2]string]string)}
	for _, d := range cfg.Domains {
		for _, l := range d.Limits {
			k.enforcement[[2]string{d.Name, l.Name}] = l.Enforcement.String()
		}
	}
	m.known.Store(k)
}

func (m *metrics) record(domain string, dec *allot.Decision, err error, took time.Duration) {
	if err != nil {
		m.errors.WithLabelValues(reason(err)).Inc()
		return
	}
	m.latency.Observe(took.Seconds())
	known := m.known.Load()
	for _, st := range dec.Statuses {
		enf, ok := known.enforcement[[2]string{domain, st.Name}]
		if !ok {
			enf = "local" // a descriptor's own limit
		}
		result := "allowed"
		switch {
		case !st.Allowed && st.Shadow:
			result = "shadow_rejected"
			m.shadow.WithLabelValues(domain, st.Name).Inc()
		case !st.Allowed:
			result = "rejected"
		}
		m.decisions.WithLabelValues(domain, st.Name, result, enf).Inc()
	}
}

// enforcerCollector exports an Enforcer's stats: its dealings with the
// regional store, per store-backed limit.
type enforcerCollector struct {
	f                                         *regional.Enforcer
	fallback, decisions, leases, tokens, live *prometheus.Desc
}

func newEnforcerCollector(f *regional.Enforcer, region string) *enforcerCollector {
	labels := prometheus.Labels{"region": region}
	desc := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, vars, labels)
	}
	return &enforcerCollector{
		f: f,
		fallback: desc("allot_regional_fallback_active",
			"1 while a leased or exact limit cannot reach the regional store and follows its on_failure policy.", "domain", "limit"),
		decisions: desc("allot_regional_fallback_decisions_total",
			"Decisions made by a limit's on_failure policy while the regional store was unreachable.", "domain", "limit", "result"),
		leases: desc("allot_regional_leases_total",
			"Leases of leased limits: granted by the store, expired with unused tokens, and give-backs (expiry or shutdown).", "domain", "limit", "event"),
		tokens: desc("allot_regional_lease_tokens_total",
			"Tokens leased from the regional store, and given back unused.", "domain", "limit", "direction"),
		live: desc("allot_regional_instances",
			"Live instances of the region, as last seen in the regional store."),
	}
}

func (c *enforcerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.fallback, c.decisions, c.leases, c.tokens, c.live} {
		ch <- d
	}
}

func (c *enforcerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.f.Stats()
	ch <- prometheus.MustNewConstMetric(c.live, prometheus.GaugeValue, float64(st.Instances))
	for _, l := range st.Limits {
		active := 0.0
		if l.Fallback {
			active = 1
		}
		counter := func(d *prometheus.Desc, v uint64, label string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l.Domain, l.Limit, label)
		}
		ch <- prometheus.MustNewConstMetric(c.fallback, prometheus.GaugeValue, active, l.Domain, l.Limit)
		counter(c.decisions, l.FallbackAllowed, "allowed")
		counter(c.decisions, l.FallbackRejected, "rejected")
		counter(c.leases, l.LeaseGrants, "grant")
		counter(c.leases, l.LeaseExpirations, "expiration")
		counter(c.leases, l.LeaseReturns, "return")
		counter(c.tokens, l.TokensGranted, "granted")
		counter(c.tokens, l.TokensReturned, "returned")
	}
}
