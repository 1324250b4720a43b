package server

import (
	"log/slog"
	"sync"
	"time"

	"github.com/allot-dev/allot"
)

// DefaultShadowLogRate is how many would-be rejections a shadow limit
// logs per second at most.
const DefaultShadowLogRate = 1

// shadowLog logs a sample of the rejections that shadow limits would have
// made: at most perSecond lines a second per limit, each counting the
// would-be rejections left out since the previous line. Every one of them
// is counted in allot_regional_shadow_rejections_total anyway. Safe for
// concurrent use.
type shadowLog struct {
	log   *slog.Logger
	every time.Duration // between two lines of a limit

	mu     sync.Mutex
	limits map[[2]string]*shadowSample // (domain, limit): bounded by the configuration
}

type shadowSample struct {
	next       time.Time // no line before
	suppressed uint64    // would-be rejections not logged since the last line
}

func newShadowLog(log *slog.Logger, perSecond float64) *shadowLog {
	return &shadowLog{log: log, every: time.Duration(float64(time.Second) / perSecond), limits: map[[2]string]*shadowSample{}}
}

// observe logs it's would-be rejections in dec, sampled. It costs nothing
// for a decision without any.
func (l *shadowLog) observe(now time.Time, it CheckItem, dec *allot.Decision) {
	for _, st := range dec.Statuses {
		if !st.Shadow || st.Allowed {
			continue
		}
		id := [2]string{it.Domain, st.Name}
		l.mu.Lock()
		sm := l.limits[id]
		if sm == nil {
			sm = &shadowSample{}
			l.limits[id] = sm
		}
		if now.Before(sm.next) {
			sm.suppressed++
			l.mu.Unlock()
			continue
		}
		suppressed := sm.suppressed
		sm.suppressed, sm.next = 0, now.Add(l.every)
		l.mu.Unlock()
		var desc string
		if st.Descriptor < len(it.Descriptors) {
			desc = it.Descriptors[st.Descriptor].String()
		}
		l.log.Info("shadow limit would reject", "domain", it.Domain, "limit", st.Name, "descriptor", desc,
			"limit_amount", st.Limit, "window", st.Window, "retry_after", st.RetryAfter, "suppressed", suppressed)
	}
}
