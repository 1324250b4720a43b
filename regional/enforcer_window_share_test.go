package regional

import (
	"testing"
)

// A share raised within a window of a store-backed sliding-window limit
// counts from the next window, as in the engine: the region that gave
// the share up may already have spent it in this window (found by the
// chaos test, internal/chaos: a split-mode exact limit admitted up to 10%
// above L over all regions in windows where shares moved).
func TestEnforcerStoreWindowShareRaisedNextWindow(t *testing.T) {
	for _, enf := range []string{"exact", "leased"} {
		t.Run(enf, func(t *testing.T) {
			cfg := `
domain: api
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s, algorithm: sliding_window, enforcement: ` + enf + `}
`
			f := newEnforcer(t, cfg, &MemoryStore{}, "a")
			if err := f.Engine().SetShare(t0.Add(-ms(500)), "api", "per-user", 0.5); err != nil {
				t.Fatal(err)
			}
			admitted := func(from, n int) int {
				ok := 0
				for i := range n {
					if check(t, f, t0.Add(ms(from+i)), user("1"), 1).Allowed {
						ok++
					}
				}
				return ok
			}
			if got := admitted(0, 80); got != 50 {
				t.Fatalf("window 1 at share 0.5: admitted %d of 80, want 50", got)
			}
			// The share doubles mid-window: nothing more in this window.
			if err := f.Engine().SetShare(t0.Add(ms(200)), "api", "per-user", 1); err != nil {
				t.Fatal(err)
			}
			if got := admitted(300, 80); got != 0 {
				t.Fatalf("window 1 after the raise: admitted %d, want 0 (the raise counts from the next window)", got)
			}
			// The next window has the whole of it; a sliding window also
			// weighs the previous window's 50 (prev·(1−x) + cur ≤ 100).
			if got := admitted(1900, 100); got < 90 {
				t.Fatalf("window 2 at share 1: admitted %d of 100, want about 95", got)
			}
		})
	}
}
