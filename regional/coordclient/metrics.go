package coordclient

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the region's side of coordination (allot_regional_assignment_*).
type metrics struct {
	version   *prometheus.GaugeVec   // domain
	appliedAt *prometheus.GaugeVec   // domain
	up        *prometheus.GaugeVec   // domain
	refusals  *prometheus.CounterVec // domain
	expiries  *prometheus.CounterVec // domain
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_regional_assignment_version", Help: "Version of the latest assignment applied.",
		}, []string{"domain"}),
		appliedAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_regional_assignment_applied_timestamp_seconds", Help: "When the latest assignment was applied (its age is time() minus this).",
		}, []string{"domain"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_regional_coordinator_connected", Help: "1 while a stream to the domain's leader is up.",
		}, []string{"domain"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_assignments_refused_total", Help: "Assignments not applied (stale or malformed).",
		}, []string{"domain"}),
		expiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_grant_expiries_total", Help: "Grants that expired without a renewal: the instance held nothing of the domain until granted again.",
		}, []string{"domain"}),
	}
	if reg != nil {
		reg.MustRegister(m.version, m.appliedAt, m.up, m.refusals, m.expiries)
	}
	return m
}

func (m *metrics) applied(domain string, term int64, version uint64, at time.Time) {
	m.version.WithLabelValues(domain).Set(float64(version))
	m.appliedAt.WithLabelValues(domain).Set(float64(at.UnixNano()) / 1e9)
}

func (m *metrics) connected(domain string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.up.WithLabelValues(domain).Set(v)
}

func (m *metrics) refused(domain string) { m.refusals.WithLabelValues(domain).Inc() }

func (m *metrics) expired(domain string) { m.expiries.WithLabelValues(domain).Inc() }
