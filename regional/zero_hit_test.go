package regional

import (
	"strconv"
	"testing"

	"github.com/allot-dev/allot"
)

// zeroHitConfigs are one limit of each algorithm, and the three on one
// descriptor (a request of several works: the trial path of apply).
var zeroHitConfigs = []struct {
	name, cfg string
	full      []int64 // a fresh key's remaining, per limit, at share 1
}{
	{"token_bucket", "domain: api\nlimits:\n  - {name: tb, match: {user: \"*\"}, rate: 10/s, burst: 6}\n", []int64{6}},
	{"gcra", "domain: api\nlimits:\n  - {name: gcra, match: {user: \"*\"}, rate: 10/s, burst: 6, algorithm: gcra}\n", []int64{6}},
	{"sliding_window", "domain: api\nlimits:\n  - {name: sw, match: {user: \"*\"}, rate: 10/s, algorithm: sliding_window}\n", []int64{10}},
	{"all three", `
domain: api
limits:
  - {name: tb, match: {user: "*"}, rate: 10/s, burst: 6}
  - {name: gcra, match: {user: "*"}, rate: 10/s, burst: 6, algorithm: gcra}
  - {name: sw, match: {user: "*"}, rate: 10/s, algorithm: sliding_window}
`, []int64{6, 6, 10}},
}

// TestZeroHitCheckOfUnknownKey: a zero-hit check (the Usage API, a
// gateway's probe) of a key the engine has never seen reports the state
// a fresh key would have, at the current share, and leaves no trace:
// no key in the table, nothing in Demand, no hot key.
func TestZeroHitCheckOfUnknownKey(t *testing.T) {
	for _, c := range zeroHitConfigs {
		t.Run(c.name, func(t *testing.T) {
			for _, share := range []float64{1, 0.5, 0} {
				e := New(mustConfig(t, c.cfg), Options{})
				for _, l := range e.Config().Domains[0].Limits {
					if err := e.SetShare(t0, "api", l.Name, share); err != nil {
						t.Fatal(err)
					}
				}
				var dec allot.Decision
				for i := range 100 {
					if err := e.Check(t0.Add(ms(i)), "api", user(strconv.Itoa(i)), 0, &dec); err != nil {
						t.Fatal(err)
					}
					if !dec.Allowed || len(dec.Statuses) != len(c.full) {
						t.Fatalf("share %v: zero-hit check of a fresh key: %+v", share, dec)
					}
					for j, st := range dec.Statuses {
						want := int64(float64(c.full[j]) * share)
						if !st.Allowed || st.Remaining != want || st.ResetAfter != 0 || st.RetryAfter != 0 {
							t.Fatalf("share %v: %s: %+v, want a full key (remaining %d, reset 0)", share, st.Name, st, want)
						}
					}
				}
				if n := e.Stats().Keys; n != 0 {
					t.Errorf("share %v: 100 zero-hit checks of unknown keys made %d keys", share, n)
				}
				if d := e.Demand(); len(d) != 0 {
					t.Errorf("share %v: demand after zero-hit checks only: %d entries, the first %+v", share, len(d), d[0])
				}
			}
		})
	}
}

// TestZeroHitChecksEvictNothing: under MaxKeys, zero-hit checks of many
// unknown keys must not push out a key that holds a charge.
func TestZeroHitChecksEvictNothing(t *testing.T) {
	for _, c := range zeroHitConfigs {
		t.Run(c.name, func(t *testing.T) {
			e := New(mustConfig(t, c.cfg), Options{MaxKeys: numShards}) // one key a shard
			var dec allot.Decision
			if err := e.Check(t0, "api", user("real"), 4, &dec); err != nil || !dec.Allowed {
				t.Fatal(err, dec)
			}
			for i := range 10 * numShards {
				if err := e.Check(t0, "api", user("probe-"+strconv.Itoa(i)), 0, &dec); err != nil {
					t.Fatal(err)
				}
			}
			if s := e.Stats(); s.EvictedActive != 0 || s.EvictedIdle != 0 {
				t.Errorf("zero-hit checks evicted keys: %+v", s)
			}
			if err := e.Check(t0, "api", user("real"), 0, &dec); err != nil {
				t.Fatal(err)
			}
			for j, st := range dec.Statuses {
				if want := c.full[j] - 4; st.Remaining != want {
					t.Errorf("%s: the charged key has %d remaining, want %d", st.Name, st.Remaining, want)
				}
			}
		})
	}
}

// TestRefundOfUnknownKey: a refund to a key never charged changes no
// state (a fresh key is full already), so it must not make the key.
func TestRefundOfUnknownKey(t *testing.T) {
	for _, c := range zeroHitConfigs {
		t.Run(c.name, func(t *testing.T) {
			e := New(mustConfig(t, c.cfg), Options{})
			var dec allot.Decision
			items := []Item{{Descriptor: user("never"), Hits: 3}}
			if err := e.RefundItems(t0, "api", items, &dec); err != nil {
				t.Fatal(err)
			}
			for j, st := range dec.Statuses {
				if st.Remaining != c.full[j] || st.ResetAfter != 0 {
					t.Errorf("%s: refund of an unknown key reports %+v, want full (%d)", st.Name, st, c.full[j])
				}
			}
			if err := e.Refund(t0, "api", user("never-2"), 5); err != nil {
				t.Fatal(err)
			}
			if n := e.Stats().Keys; n != 0 {
				t.Errorf("refunds of unknown keys made %d keys", n)
			}
			if d := e.Demand(); len(d) != 0 {
				t.Errorf("demand after refunds only: %d entries, the first %+v", len(d), d[0])
			}
		})
	}
}

// TestZeroHitInItemsOnOneKey: a zero-hit item and a charging item on
// the same unknown key in one request: the charge makes the key, the
// zero-hit item reports the state before it.
func TestZeroHitInItemsOnOneKey(t *testing.T) {
	e := New(mustConfig(t, zeroHitConfigs[0].cfg), Options{})
	var dec allot.Decision
	items := []Item{{Descriptor: user("1"), Hits: 0}, {Descriptor: user("1"), Hits: 2}}
	if err := e.CheckItems(t0, "api", items, &dec); err != nil || !dec.Allowed {
		t.Fatal(err, dec)
	}
	if st := dec.Statuses; st[0].Remaining != 6 || st[1].Remaining != 4 {
		t.Fatalf("statuses %+v, want 6 then 4", st)
	}
	if n := e.Stats().Keys; n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
	// The other order: the zero-hit item sees the charge before it.
	items = []Item{{Descriptor: user("2"), Hits: 2}, {Descriptor: user("2"), Hits: 0}}
	if err := e.CheckItems(t0, "api", items, &dec); err != nil || !dec.Allowed {
		t.Fatal(err, dec)
	}
	if st := dec.Statuses; st[0].Remaining != 4 || st[1].Remaining != 4 {
		t.Fatalf("statuses %+v, want 4 then 4", st)
	}
	if err := e.Check(t0, "api", user("2"), 0, &dec); err != nil || dec.Statuses[0].Remaining != 4 {
		t.Fatalf("after: %+v %v", dec, err)
	}
}

// TestZeroHitOfSharedKeyKnownFromPeers: a shared-mode key this region
// has never charged but its peers have counted is not a fresh key: a
// zero-hit check reports the peers' counts. One nobody has counted is
// fresh and is not made.
func TestZeroHitOfSharedKeyKnownFromPeers(t *testing.T) {
	c := mustConfig(t, sharedConfig)
	a, b := New(c, Options{}), New(c, Options{})
	if err := a.SetPeers("a", []string{"b", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers("b", []string{"a", "c"}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(ms(100))
	for _, e := range []*Engine{a, b} {
		for _, r := range abc {
			e.Heard(now, r)
		}
	}
	var dec allot.Decision
	// One request of 600: 600 of 1 at one instant are a burst above b's
	// budget of what its peers have not seen (allot.SharedBudget = 500).
	if err := b.Check(now, "api", user("1"), 600, &dec); err != nil || !dec.Allowed {
		t.Fatal(err, dec)
	}
	for _, bt := range b.SyncOut(now) {
		if _, err := a.Inbound(now, Source{Region: "b", Stream: "b"}, bt); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Check(now, "api", user("2"), 0, &dec); err != nil || dec.Statuses[0].Remaining != 1000 {
		t.Fatalf("unknown key: %+v %v", dec, err)
	}
	if n := a.Stats().Keys; n != 0 {
		t.Fatalf("a zero-hit check of an unknown shared key made %d keys", n)
	}
	if err := a.Check(now, "api", user("1"), 0, &dec); err != nil || dec.Statuses[0].Remaining != 400 {
		t.Fatalf("key counted by b: %+v %v, want 400 remaining", dec, err)
	}
}
