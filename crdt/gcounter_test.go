package crdt

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

var regions = []string{"ap-south", "eu-west", "us-east"}

var (
	regionGen = rapid.SampledFrom(regions)
	amountGen = rapid.OneOf(rapid.Uint64Max(100), rapid.Uint64())
)

var gcounterGen = rapid.Custom(func(t *rapid.T) *GCounter {
	var c GCounter
	for range rapid.IntRange(0, 6).Draw(t, "incs") {
		c.Inc(regionGen.Draw(t, "region"), amountGen.Draw(t, "n"))
	}
	return &c
})

var pncounterGen = rapid.Custom(func(t *rapid.T) *PNCounter {
	return &PNCounter{P: *gcounterGen.Draw(t, "P"), N: *gcounterGen.Draw(t, "N")}
})

// mergeable is what the merge laws need of a counter.
type mergeable[C any] interface {
	Clone() C
	Merge(C)
	Equal(C) bool
}

func merged[C mergeable[C]](first C, rest ...C) C {
	m := first.Clone()
	for _, c := range rest {
		m.Merge(c)
	}
	return m
}

func checkMergeLaws[C mergeable[C]](t *rapid.T, a, b, c C) {
	if !merged(a, b).Equal(merged(b, a)) {
		t.Fatalf("merge is not commutative")
	}
	if !merged(merged(a, b), c).Equal(merged(a, merged(b, c))) {
		t.Fatalf("merge is not associative")
	}
	if !merged(a, a).Equal(a) || !merged(merged(a, b), b).Equal(merged(a, b)) {
		t.Fatalf("merge is not idempotent")
	}
}

func TestGCounterMergeLaws(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := gcounterGen.Draw(t, "a"), gcounterGen.Draw(t, "b"), gcounterGen.Draw(t, "c")
		checkMergeLaws(t, a, b, c)
		m := merged(a, b)
		for _, r := range regions {
			if got, want := m.Slot(r), max(a.Slot(r), b.Slot(r)); got != want {
				t.Fatalf("slot %s after merge = %d, want max %d", r, got, want)
			}
		}
	})
}

func TestPNCounterMergeLaws(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		checkMergeLaws(t, pncounterGen.Draw(t, "a"), pncounterGen.Draw(t, "b"), pncounterGen.Draw(t, "c"))
	})
}

func TestGCounterMonotonic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var c GCounter
		prev := c.Clone()
		t.Repeat(map[string]func(*rapid.T){
			"inc":   func(t *rapid.T) { c.Inc(regionGen.Draw(t, "region"), amountGen.Draw(t, "n")) },
			"merge": func(t *rapid.T) { c.Merge(gcounterGen.Draw(t, "other")) },
			"": func(t *rapid.T) {
				if c.Value() < prev.Value() {
					t.Fatalf("value went down from %d to %d", prev.Value(), c.Value())
				}
				for _, r := range regions {
					if c.Slot(r) < prev.Slot(r) {
						t.Fatalf("slot %s went down from %d to %d", r, prev.Slot(r), c.Slot(r))
					}
				}
				prev = c.Clone()
			},
		})
	})
}

func TestGCounter(t *testing.T) {
	var zero, c GCounter
	if zero.Value() != 0 || zero.Slot("us-east") != 0 {
		t.Fatalf("zero value: Value %d, Slot %d, want 0", zero.Value(), zero.Slot("us-east"))
	}
	c.Inc("us-east", 0)
	if !c.Equal(&zero) {
		t.Fatalf("Inc by 0 changed the counter")
	}
	c.Inc("us-east", 3)
	c.Inc("eu-west", 4)
	c.Inc("us-east", 2)
	if c.Value() != 9 || c.Slot("us-east") != 5 || c.Slot("eu-west") != 4 {
		t.Fatalf("Value %d, us-east %d, eu-west %d; want 9, 5, 4", c.Value(), c.Slot("us-east"), c.Slot("eu-west"))
	}
	d := c.Clone()
	d.Inc("us-east", 1)
	if c.Slot("us-east") != 5 {
		t.Fatalf("Inc on a clone changed the original")
	}
	c.Inc("ap-south", math.MaxUint64)
	if c.Value() != math.MaxUint64 {
		t.Fatalf("Value = %d, want saturation at MaxUint64", c.Value())
	}
	c.Inc("ap-south", 1)
	if c.Slot("ap-south") != math.MaxUint64 {
		t.Fatalf("slot = %d, want saturation at MaxUint64", c.Slot("ap-south"))
	}
}

func TestPNCounterValue(t *testing.T) {
	type op struct {
		region string
		n      int64 // > 0: Inc, < 0: Dec
	}
	tests := []struct {
		name string
		ops  []op
		want int64
	}{
		{"zero", nil, 0},
		{"inc", []op{{"a", 5}, {"b", 7}}, 12},
		{"refund", []op{{"a", 10}, {"a", -4}}, 6},
		{"below zero", []op{{"a", 3}, {"b", -5}}, -2},
		{"clamped high", []op{{"a", math.MaxInt64}, {"b", math.MaxInt64}}, math.MaxInt64},
		{"clamped low", []op{{"a", -math.MaxInt64}, {"b", -math.MaxInt64}}, math.MinInt64},
	}
	for _, tt := range tests {
		var c PNCounter
		for _, o := range tt.ops {
			if o.n > 0 {
				c.Inc(o.region, uint64(o.n))
			} else {
				c.Dec(o.region, uint64(-o.n))
			}
		}
		if got := c.Value(); got != tt.want {
			t.Errorf("%s: Value = %d, want %d", tt.name, got, tt.want)
		}
	}
}
