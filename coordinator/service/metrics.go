package service

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/coordinator"
)

// metrics are the coordinator's series (allot_coordinator_*). Labels are
// domains, limits and regions from the configuration, never keys.
type metrics struct {
	isLeader  *prometheus.GaugeVec     // domain
	rebalance *prometheus.HistogramVec // domain
	shares    *prometheus.GaugeVec     // domain, limit, region
	reports   *prometheus.CounterVec   // domain, result
	rejects   *prometheus.CounterVec   // domain, reason
	hotKeys   *prometheus.GaugeVec     // domain
	version   *prometheus.GaugeVec     // domain
	term      *prometheus.GaugeVec     // domain
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		isLeader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_coordinator_is_leader", Help: "1 while this coordinator leads the domain.",
		}, []string{"domain"}),
		rebalance: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "allot_coordinator_rebalance_duration_seconds", Help: "Time one rebalance takes.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}, []string{"domain"}),
		shares: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_coordinator_share_ratio", Help: "Share of each limit's default vector last assigned to each region.",
		}, []string{"domain", "limit", "region"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_coordinator_messages_total", Help: "Reports and acks received, by kind and result (applied, rejected).",
		}, []string{"domain", "kind", "result"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_coordinator_rejections_total", Help: "Messages refused, by reason; nothing of them was applied.",
		}, []string{"domain", "reason"}),
		hotKeys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_coordinator_hot_keys", Help: "Hot keys tracked.",
		}, []string{"domain"}),
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_coordinator_assignment_version", Help: "Version of the latest assignment sent.",
		}, []string{"domain"}),
		term: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_coordinator_term", Help: "Election revision of the leadership this coordinator holds.",
		}, []string{"domain"}),
	}
	if reg != nil {
		reg.MustRegister(m.isLeader, m.rebalance, m.shares, m.reports, m.rejects, m.hotKeys, m.version, m.term)
	}
	return m
}

func (m *metrics) leader(domain string, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.isLeader.WithLabelValues(domain).Set(v)
}

func (m *metrics) rebalanced(domain string, took time.Duration) {
	m.rebalance.WithLabelValues(domain).Observe(took.Seconds())
}

func (m *metrics) rejected(domain, reason string) {
	m.rejects.WithLabelValues(domain, reason).Inc()
}

func (m *metrics) message(domain string, msg coordinator.Message, err error) {
	kind := "report"
	if _, ok := msg.(coordinator.Ack); ok {
		kind = "ack"
	}
	result := "applied"
	if err != nil {
		result = "rejected"
		m.rejected(domain, reasonOf(err))
	}
	m.reports.WithLabelValues(domain, kind, result).Inc()
}

func reasonOf(err error) string {
	for _, r := range []struct {
		err    error
		reason string
	}{
		{coordinator.ErrUnknownLimit, "unknown_limit"},
		{coordinator.ErrUnknownRegion, "unknown_region"},
		{coordinator.ErrUnknownDomain, "unknown_domain"},
		{coordinator.ErrBadValue, "bad_value"},
		{coordinator.ErrStale, "stale"},
		{coordinator.ErrBadVersion, "bad_version"},
	} {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

func (m *metrics) ready(domain string, rd coordinator.Ready, st coordinator.Stats) {
	for _, a := range rd.Send {
		for _, s := range a.Shares {
			if s.Key == "" {
				m.shares.WithLabelValues(domain, s.Limit, a.Region).Set(s.Value)
			}
		}
	}
	m.hotKeys.WithLabelValues(domain).Set(float64(st.HotKeys))
	m.version.WithLabelValues(domain).Set(float64(st.Version))
	m.term.WithLabelValues(domain).Set(float64(st.Term))
}
