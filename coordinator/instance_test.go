package coordinator

import (
	"slices"
	"testing"
	"time"
)

// What an Instance applies to a key of a Weighted limit: the key's share
// (its own, or the limit's default) × its weight of its own for the key,
// × its weight for the limit × the key's rest factor, or × its weight for
// the limit; the shares returned lower first, and only what changed.
func TestInstanceKeyWeights(t *testing.T) {
	d := mustDomain(t, fleetConfig)
	x, err := NewInstance(d, "us-east", "a")
	if err != nil {
		t.Fatal(err)
	}
	x.Shares()
	grant := func(seq uint64, full bool, version uint64, shares []Share, ws ...Weight) Assignment {
		return Assignment{Domain: "api", Region: "us-east", Term: 1, Version: version, Instance: "a", Shares: shares,
			Grant: &Grant{Seq: seq, Expires: t0.Add(time.Minute), Full: full, Weights: ws}}
	}
	type level struct {
		key   string
		value float64 // Follow: no share of its own in the engine
	}
	steps := []struct {
		name string
		a    Assignment
		want []level // the levels of the local limit after it
		out  []Share // what Apply returns
	}{
		{
			name: "full grant",
			a: grant(1, true, 3, []Share{{Limit: "loc", Value: 0.5}, {Limit: "loc", Key: "k0", Value: 0.8}, {Limit: "loc", Key: "k2", Value: 0.6}, {Limit: "ex", Value: 0.5}},
				Weight{Limit: "loc", Value: 0.5}, Weight{Limit: "loc", Key: "k0", Value: 0.9}, Weight{Limit: "loc", Key: "k1", Value: 0.25, Rest: true}),
			want: []level{{"", 0.25}, {"k0", 0.72}, {"k1", 0.0625}, {"k2", 0.3}, {"k3", Follow}},
		},
		{
			name: "the weight of its own goes, k1's rest factor is back to 1",
			a:    grant(2, false, 0, nil, Weight{Limit: "loc", Value: 0.5}, Weight{Limit: "loc", Key: "k1", Value: 1, Rest: true}),
			want: []level{{"", 0.25}, {"k0", 0.4}, {"k1", Follow}, {"k2", 0.3}},
			out:  []Share{{Limit: "loc", Key: "k0", Value: 0.4}, {Limit: "loc", Key: "k1", Value: Follow}},
		},
		{
			name: "the weight for the limit rises: its hot keys and rest factors follow, keys with a weight of their own do not",
			a: grant(3, false, 0, nil, Weight{Limit: "loc", Value: 0.8}, Weight{Limit: "loc", Key: "k2", Value: 0.5},
				Weight{Limit: "loc", Key: "k3", Value: 0.5, Rest: true}),
			want: []level{{"", 0.4}, {"k0", 0.64}, {"k2", 0.3}, {"k3", 0.2}},
			// k3 followed the default (0.25): its rest factor lowers it.
			out: []Share{{Limit: "loc", Key: "k3", Value: 0.2}, {Limit: "loc", Value: 0.4}, {Limit: "loc", Key: "k0", Value: 0.64}},
		},
		{
			name: "the default share falls: lowered first, with the keys that follow it",
			a:    grant(4, false, 4, []Share{{Limit: "loc", Value: 0.25}, {Limit: "loc", Key: "k0", Value: 0.9}}, Weight{Limit: "loc", Value: 0.8}, Weight{Limit: "loc", Key: "k2", Value: 0.5}, Weight{Limit: "loc", Key: "k3", Value: 0.5, Rest: true}),
			want: []level{{"", 0.2}, {"k0", 0.72}, {"k2", 0.3}, {"k3", 0.1}},
			out:  []Share{{Limit: "loc", Value: 0.2}, {Limit: "loc", Key: "k3", Value: 0.1}, {Limit: "loc", Key: "k0", Value: 0.72}},
		},
		{
			name: "a full grant replaces every rest factor",
			a:    grant(5, true, 4, []Share{{Limit: "loc", Value: 0.25}, {Limit: "loc", Key: "k0", Value: 0.9}, {Limit: "ex", Value: 0.5}}, Weight{Limit: "loc", Value: 0.8}, Weight{Limit: "loc", Key: "k1", Value: 0.5, Rest: true}),
			want: []level{{"", 0.2}, {"k0", 0.72}, {"k1", 0.1}, {"k2", Follow}, {"k3", Follow}},
		},
	}
	for _, st := range steps {
		out, _, err := x.Apply(t0, st.a)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		for _, l := range st.want {
			got, has := x.level(keyID{"loc", l.key})
			if !has {
				got = Follow
			}
			if d := got - l.value; d > 1e-9 || d < -1e-9 {
				t.Errorf("%s: level of %q is %v, want %v", st.name, l.key, got, l.value)
			}
		}
		if st.out != nil && !slices.EqualFunc(out, st.out, func(a, b Share) bool {
			d := a.Value - b.Value
			return a.Limit == b.Limit && a.Key == b.Key && d < 1e-9 && d > -1e-9
		}) {
			t.Errorf("%s: Apply returned %+v, want %+v", st.name, out, st.out)
		}
	}
	_, ws := x.Hello()
	want := []Weight{KeyAware, {Limit: "loc", Value: 0.8}, {Limit: "loc", Key: "k1", Value: 0.5, Rest: true}}
	if !slices.Equal(ws, want) {
		t.Fatalf("Hello's weights are %+v, want %+v", ws, want)
	}
	if _, _, err := x.Apply(t0, grant(6, false, 0, nil, Weight{Limit: "ex", Key: "k1", Value: 0.5})); err == nil {
		t.Fatal("a weight of its own for a key of a limit that is not divided among instances was applied")
	}
	if _, _, err := x.Apply(t0, grant(6, false, 0, nil, Weight{Limit: "loc", Value: 0.5, Rest: true})); err == nil {
		t.Fatal("a rest factor without a key was applied")
	}
}
