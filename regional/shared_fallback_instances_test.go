package regional

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// While a peer is stale, a shared-mode limit falls back to the region's
// split share: the region's, over all its instances, not each
// instance's. The instances' counts (the CountStore) still apply; only
// the silent peers' are left out (found by the chaos test,
// internal/chaos: with two instances per region a partition let the
// shared limit admit up to 1.5 L).
func TestSharedFallbackCountsTheRegionsInstances(t *testing.T) {
	c := mustConfig(t, sharedConfig)
	now := time.Now().Truncate(time.Second).Add(100 * time.Millisecond)
	mk := func() *Engine {
		e := New(c, Options{})
		if err := e.SetPeers("a", []string{"b", "c"}); err != nil {
			t.Fatal(err)
		}
		if err := e.SetShare(now.Add(-time.Second), "api", "global", 0.5); err != nil {
			t.Fatal(err)
		}
		return e
	}
	a1, a2 := mk(), mk() // neither hears b or c: both in fallback
	var store MemoryCounts
	tick := func(e *Engine, instance string) {
		ops := e.CountOps(e.CollectCounts(now, true), nil)
		res := make([]RegionCount, len(ops))
		if err := store.MergeCounts(context.Background(), instance, ops, res); err != nil {
			t.Fatal(err)
		}
		e.PublishCounts(now, res)
	}
	admit := func(e *Engine, n int) int {
		ok := 0
		var dec allot.Decision
		for range n {
			if err := e.Check(now, "api", user("1"), 1, &dec); err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				ok++
			}
		}
		return ok
	}
	if got := admit(a1, 300); got != 300 {
		t.Fatalf("a1 admitted %d of 300, want 300 (the region's split share is 500)", got)
	}
	if got := admit(a2, 1); got != 1 { // a2 has the key: its tick asks the store for it
		t.Fatalf("a2 admitted %d of 1", got)
	}
	tick(a1, "a1")
	tick(a2, "a2")
	now = now.Add(10 * time.Millisecond)
	if got := admit(a2, 500); got != 199 {
		t.Fatalf("a2 admitted %d of 500 after a1's 300 and its own 1, want 199: the region's share is 500 over both instances", got)
	}
}
