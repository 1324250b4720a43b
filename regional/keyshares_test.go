package regional

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/allot-dev/allot"
)

// SetKeyShares is SetKeyShare applied to each share in turn.
func TestSetKeySharesAsOneByOne(t *testing.T) {
	cfg := mustConfig(t, `
domain: api
regions: [us, eu]
limits:
  - {name: per-user, match: {user: "*"}, rate: 100/1s, algorithm: sliding_window}
`)
	l := cfg.Domains[0].Limit("per-user")
	key := func(i int) string { return KeyString(l, user(fmt.Sprint(i))) }
	batches := [][]KeyShare{
		{{key(1), 0.5}, {key(2), 0.25}, {key(3), 1}},
		{{key(2), -1}, {key(1), 0.75}, {key(4), 0}, {key(1), 0.5}},
		{{key(3), 0.1}, {key(5), -1}},
	}
	one, many := New(cfg, Options{}), New(cfg, Options{})
	for i, b := range batches {
		now := t0.Add(ms(300 * i))
		for _, s := range b {
			if err := one.SetKeyShare(now, "api", "per-user", s.Key, s.Share); err != nil {
				t.Fatal(err)
			}
		}
		if err := many.SetKeyShares(now, "api", "per-user", b); err != nil {
			t.Fatal(err)
		}
		for k := 0; k <= 6; k++ {
			if a, b := one.Share("api", "per-user", key(k)), many.Share("api", "per-user", key(k)); a != b {
				t.Fatalf("batch %d, key %d: SetKeyShare gives %v, SetKeyShares %v", i, k, a, b)
			}
		}
	}
	// The same decisions, window after window, as shares changed.
	var d1, d2 allot.Decision
	for n := range 400 {
		now, desc := t0.Add(ms(5*n)), user(fmt.Sprint(n%6))
		if err := one.Check(now, "api", desc, 1, &d1); err != nil {
			t.Fatal(err)
		}
		if err := many.Check(now, "api", desc, 1, &d2); err != nil {
			t.Fatal(err)
		}
		if d1.Allowed != d2.Allowed || d1.Statuses[0].Remaining != d2.Statuses[0].Remaining {
			t.Fatalf("request %d: %+v vs %+v", n, d1, d2)
		}
	}
	for _, bad := range []KeyShare{{key(1), 1.5}, {key(1), math.NaN()}, {"per-user:nobody", 0.5}} {
		before := many.Share("api", "per-user", key(3))
		err := many.SetKeyShares(t0.Add(ms(2000)), "api", "per-user", []KeyShare{{key(3), 0.9}, bad})
		if !errors.Is(err, ErrBadShare) && !errors.Is(err, ErrBadDescriptor) {
			t.Errorf("%+v: want ErrBadShare or ErrBadDescriptor, got %v", bad, err)
		}
		if got := many.Share("api", "per-user", key(3)); got != before {
			t.Errorf("%+v: a failed SetKeyShares set a share (%v, was %v)", bad, got, before)
		}
	}
}
