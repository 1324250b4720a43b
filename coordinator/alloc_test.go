package coordinator

import (
	"math"
	"testing"
)

func TestInitialShares(t *testing.T) {
	tests := []struct {
		floors  map[string]float64
		regions []string
		want    []float64
	}{
		{nil, []string{"us"}, []float64{1}}, // alone: the whole limit
		{nil, []string{"us", "eu"}, []float64{0.5, 0.5}},
		{map[string]float64{"us": 0.2}, []string{"us", "eu"}, []float64{0.6, 0.4}},
		{map[string]float64{"us": 0.5, "eu": 0.5}, []string{"us", "eu"}, []float64{0.5, 0.5}},
		{nil, []string{"us", "eu", "ap"}, []float64{1. / 3, 1. / 3, 1. / 3}},
	}
	for _, tt := range tests {
		got := InitialShares(tt.floors, tt.regions)
		sum := 0.0
		for i := range got {
			sum += got[i]
			if math.Abs(got[i]-tt.want[i]) > 1e-7 || float64(float32(got[i])) != got[i] {
				t.Errorf("InitialShares(%v, %v) = %v, want %v as float32", tt.floors, tt.regions, got, tt.want)
			}
		}
		if sum > 1 {
			t.Errorf("InitialShares(%v, %v) sums to %v", tt.floors, tt.regions, sum)
		}
	}
}

// TestAllocate: rows of one vector of three regions with floors of 0.05,
// hysteresis 0.01 and a step of at most 0.5.
func TestAllocate(t *testing.T) {
	third := 1. / 3
	tests := []struct {
		name         string
		demand       []float64
		live         []bool
		shares, held []float64
		maxStep      float64 // 0: no cap
		want         []float64
	}{
		{name: "proportional", demand: []float64{2, 1, 1}, want: []float64{0.05 + 0.85/2, 0.05 + 0.85/4, 0.05 + 0.85/4}},
		{name: "one region has all", demand: []float64{5, 0, 0}, want: []float64{0.9, 0.05, 0.05}},
		{name: "no demand keeps shares", demand: []float64{0, 0, 0}, shares: []float64{0.5, 0.3, 0.2}, want: []float64{0.5, 0.3, 0.2}},
		{name: "frozen region keeps its share; the others divide what it does not hold",
			demand: []float64{1, 1, 9}, live: []bool{true, true, false},
			shares: []float64{0.3, 0.3, 0.2}, held: []float64{0.3, 0.3, 0.4},
			want: []float64{0.3, 0.3, 0.2}}, // (1 − 0.4) / 2 each: within hysteresis of 0.3
		{name: "frozen region, uneven demand", demand: []float64{3, 1, 0}, live: []bool{true, true, false},
			shares: []float64{0.3, 0.3, 0.4}, held: []float64{0.3, 0.3, 0.4},
			want: []float64{0.05 + 0.5*0.75, 0.05 + 0.5*0.25, 0.4}},
		{name: "capped step", demand: []float64{0, 1, 0}, shares: []float64{0.9, 0.05, 0.05}, maxStep: 0.5,
			want: []float64{0.4, 0.55, 0.05}},
		{name: "hysteresis", demand: []float64{1, 1, 1.05}, want: []float64{third, third, third}},
	}
	for _, tt := range tests {
		n := len(tt.demand)
		v := Vector{Floors: []float64{0.05, 0.05, 0.05}, Demand: tt.demand, Live: tt.live, Shares: tt.shares, Held: tt.held}
		if v.Live == nil {
			v.Live = []bool{true, true, true}
		}
		if v.Shares == nil {
			v.Shares = []float64{third, third, third}
		}
		if v.Held == nil {
			v.Held = v.Shares
		}
		maxStep := tt.maxStep
		if maxStep == 0 {
			maxStep = 1
		}
		got := make([]float64, n)
		Allocate(got, v, 0.01, maxStep)
		for r := range got {
			if math.Abs(got[r]-tt.want[r]) > 1e-9 {
				t.Errorf("%s: Allocate = %v, want %v", tt.name, got, tt.want)
				break
			}
		}
	}
}
