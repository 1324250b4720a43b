package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// metrics are the store's Prometheus series; op is take, lease or
// heartbeat.
type metrics struct {
	calls    *prometheus.CounterVec   // op, result
	scripts  *prometheus.CounterVec   // op
	duration *prometheus.HistogramVec // op
}

func newMetrics(s *Store, reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_store_calls_total",
			Help: "Calls to the regional store, by operation and result (ok, timeout, late, breaker_open, overloaded, error).",
		}, []string{"op", "result"}),
		scripts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_regional_store_scripts_total",
			Help: "Lua script calls sent to Redis, pipelined with concurrent ones, by operation.",
		}, []string{"op"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "allot_regional_store_call_duration_seconds",
			Help:    "Time a call to the regional store takes, failed ones included.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14), // 25µs … 200ms
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.scripts, m.duration,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "allot_regional_store_breaker_state",
				Help: "The regional store's circuit breaker: 0 closed, 1 half-open, 2 open.",
			}, func() float64 { return float64(s.breaker.State()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "allot_regional_store_queued",
				Help: "Script calls waiting in the pipeline.",
			}, func() float64 { return float64(s.ap.Len()) }),
		)
	}
	return m
}

func (m *metrics) observe(op string, err error, took time.Duration, scripts int) {
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrLate):
		result = "late"
	case errors.Is(err, context.DeadlineExceeded):
		result = "timeout"
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		result = "breaker_open"
	case errors.Is(err, redis.ErrAutoPipelineQueueFull):
		result = "overloaded"
	default:
		result = "error"
	}
	m.calls.WithLabelValues(op, result).Inc()
	if result != "breaker_open" {
		m.scripts.WithLabelValues(op).Add(float64(scripts))
		m.duration.WithLabelValues(op).Observe(took.Seconds())
	}
}
