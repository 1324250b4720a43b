package regional

import (
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// FuzzCheckItems feeds the engine arbitrary requests: it must answer or
// refuse each with an error, never panic, and never admit above a limit's
// burst in one instant.
func FuzzCheckItems(f *testing.F) {
	f.Add([]byte("user\x001\x00tenant\x00acme"), int64(1), uint8(3))
	f.Add([]byte("\x00\x00\x00"), int64(-1), uint8(70))
	f.Add([]byte("route\x00/v1/chat\x00user\x00*"), int64(0), uint8(1))
	cfg, err := allot.ParseConfig("fuzz.yaml", []byte(`
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 10/s, burst: 5}
  - {name: per-tenant, match: {tenant: "*"}, rate: 100/s, algorithm: gcra}
  - {name: chat, match: {route: "/v1/*", user: "*"}, rate: 3/s, algorithm: sliding_window}
  - {name: shadow, match: {}, rate: 1/s, shadow: true}
`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte, hits int64, n uint8) {
		e := New(cfg, Options{MaxKeys: 256})
		var fields []string
		start := 0
		for i, b := range raw {
			if b == 0 {
				fields = append(fields, string(raw[start:i]))
				start = i + 1
			}
		}
		fields = append(fields, string(raw[start:]))
		var items []Item
		for i := 0; i < int(n)%80; i++ {
			var d allot.Descriptor
			for j := i % 3; j+1 < len(fields); j += 2 {
				d = append(d, allot.Entry{Key: fields[j], Value: fields[j+1]})
			}
			items = append(items, Item{Descriptor: d, Hits: hits + int64(i%2)})
		}
		var dec allot.Decision
		t0 := time.Unix(1_700_000_000, 0)
		for k := range 3 {
			if err := e.CheckItems(t0, "api", items, &dec); err != nil {
				return
			}
			for _, st := range dec.Statuses {
				if st.Remaining < 0 {
					t.Fatalf("round %d: negative remaining %+v", k, st)
				}
			}
		}
	})
}
