package regional

import (
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

// keyDemand returns the entry of Demand for key, or false.
func keyDemand(ds []allot.Demand, key string) (allot.Demand, bool) {
	for _, d := range ds {
		if d.Key == key {
			return d, true
		}
	}
	return allot.Demand{}, false
}

// TestDemandTalliesTrackedKeys: a key is counted on its own from the
// request that left it near its allowance, and then in full in every
// interval while it stays near; a key the region holds a share of its own
// for is counted in full from the drain after the share came, near or not.
func TestDemandTalliesTrackedKeys(t *testing.T) {
	e := New(mustConfig(t, "domain: api\nlimits:\n  - {name: per-user, match: {user: \"*\"}, rate: 10/s}\n"), Options{})
	var dec allot.Decision
	check := func(at time.Duration, u string, n int) {
		t.Helper()
		for range n {
			if err := e.Check(t0.Add(at), "api", user(u), 1, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	const k1, k2 = "per-user:user=1", "per-user:user=2"
	check(0, "1", 12) // near from the 9th (1 left): tallied from there, 2 admitted and 2 rejected
	d, ok := keyDemand(e.Demand(), k1)
	if !ok || d.Admitted != 2 || d.Rejected != 2 || !d.NearLimit {
		t.Fatalf("first interval: %+v (ok %v), want 2 admitted, 2 rejected, near", d, ok)
	}
	check(time.Second, "1", 12) // tracked: all 12 count
	d, ok = keyDemand(e.Demand(), k1)
	if !ok || d.Admitted+d.Rejected != 12 || !d.NearLimit {
		t.Fatalf("second interval: %+v (ok %v), want all 12, near", d, ok)
	}
	check(2*time.Second, "1", 3) // far from its allowance: counted, then dropped
	if d, ok = keyDemand(e.Demand(), k1); !ok || d.Admitted != 3 || d.NearLimit {
		t.Fatalf("third interval: %+v (ok %v), want 3 admitted, not near", d, ok)
	}
	check(3*time.Second, "1", 3)
	if d, ok = keyDemand(e.Demand(), k1); ok {
		t.Fatalf("fourth interval: %+v, want the key no longer counted on its own", d)
	}

	if err := e.SetKeyShare(t0.Add(3*time.Second), "api", "per-user", k2, 0.5); err != nil {
		t.Fatal(err)
	}
	if d, ok = keyDemand(e.Demand(), k2); !ok || d.Admitted != 0 || d.Rejected != 0 {
		t.Fatalf("a key with a share of its own: %+v (ok %v), want it reported without traffic", d, ok)
	}
	check(4*time.Second, "2", 2) // 2 of 5: not near, counted in full
	if d, ok = keyDemand(e.Demand(), k2); !ok || d.Admitted != 2 || d.NearLimit {
		t.Fatalf("a key with a share of its own, after a drain: %+v (ok %v), want 2 admitted, not near", d, ok)
	}
}
