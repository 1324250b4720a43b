package regional

import (
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// BenchmarkDecideTrackedKey decides requests of one key that is over its
// allowance, so that its demand is counted on its own (demand.go): the
// decision path's cost of tallying a tracked key.
func BenchmarkDecideTrackedKey(b *testing.B) {
	e := New(mustConfig(b, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 1000/s}\n"), Options{})
	desc := user("42")
	dec := allot.Decision{Statuses: make([]allot.LimitStatus, 0, 4)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = e.Check(t0.Add(time.Duration(i)*time.Microsecond), "api", desc, 1, &dec)
	}
}
