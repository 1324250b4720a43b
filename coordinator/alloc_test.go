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

// TestAllocateUseFirst: rows of the rule with the limit's rate known
// (Scale 1000 per second), two or three regions without floors,
// hysteresis 0.01, no cap on a step.
func TestAllocateUseFirst(t *testing.T) {
	tests := []struct {
		name          string
		demand, claim []float64
		known         []bool
		keep          []float64
		shares        []float64
		want          []float64
	}{
		{name: "overloaded: by demand, as one global limiter",
			demand: []float64{600, 400, 200}, want: []float64{0.5, 1. / 3, 1. / 6}},
		{name: "under L, no claims above use: by demand",
			demand: []float64{300, 100, 100}, want: []float64{0.6, 0.2, 0.2}},
		{name: "a region that bursts now and then keeps what no one needs",
			demand: []float64{500, 0}, claim: []float64{500, 1500}, shares: []float64{0.5, 0.5},
			want: []float64{0.55, 0.45}}, // us: its use + Headroom; eu: the rest, up to its claim
		{name: "equal claims, one on now: max-min fair",
			demand: []float64{300, 0}, claim: []float64{700, 700}, shares: []float64{0.5, 0.5},
			want: []float64{0.5, 0.5}},
		{name: "a stale claim does not pin a region below its use",
			demand: []float64{800, 0}, claim: []float64{800, 600}, shares: []float64{0.4, 0.6},
			want: []float64{0.88, 0.12}},
		{name: "claims met: the rest by demand",
			demand: []float64{200, 100}, claim: []float64{300, 100}, shares: []float64{0.5, 0.5},
			want: []float64{0.3 + 0.59*2/3, 0.11 + 0.59/3}}, // claims 0.3 and the need 0.11, then the rest by demand
		{name: "headroom cut where it does not fit",
			demand: []float64{500, 450}, want: []float64{0.5 + 0.05*0.5/0.95, 0.45 + 0.05*0.45/0.95}},
		{name: "a region of unknown demand keeps its share",
			demand: []float64{900, 0, 100}, known: []bool{true, false, true}, shares: []float64{0.3, 0.3, 0.4},
			want: []float64{0.7 * 0.9, 0.3, 0.7 * 0.1}},
		{name: "... or what its demand for the whole limit could use",
			demand: []float64{900, 0, 100}, known: []bool{true, false, true}, keep: []float64{1, 0.1, 1},
			shares: []float64{0.3, 0.3, 0.4}, want: []float64{0.9 * 0.9, 0.1, 0.9 * 0.1}},
		{name: "a live region without demand keeps MinShare",
			demand: []float64{1200, 0}, want: []float64{1 - MinShare, MinShare}},
	}
	for _, tt := range tests {
		n := len(tt.demand)
		v := Vector{Floors: make([]float64, n), Demand: tt.demand, Claim: tt.claim, Known: tt.known, Keep: tt.keep,
			Live: make([]bool, n), Shares: tt.shares, Scale: 1000}
		for r := range n {
			v.Live[r] = true
		}
		if v.Shares == nil {
			v.Shares = make([]float64, n)
			for r := range n {
				v.Shares[r] = 1 / float64(n)
			}
		}
		v.Held = v.Shares
		got := make([]float64, n)
		Allocate(got, v, 0.01, 1)
		sum := 0.0
		for r := range got {
			sum += got[r]
			if math.Abs(got[r]-tt.want[r]) > 1e-6 {
				t.Errorf("%s: Allocate = %.4f, want %.4f", tt.name, got, tt.want)
				break
			}
		}
		if sum > 1+1e-9 {
			t.Errorf("%s: shares sum to %v", tt.name, sum)
		}
	}
}

// TestAllocateHysteresisAllOrNothing: a vector moves as a whole or not at
// all, so that a raise is never left waiting for a lowering that
// hysteresis withheld.
func TestAllocateHysteresisAllOrNothing(t *testing.T) {
	v := Vector{Floors: make([]float64, 3), Demand: []float64{1.04, 0.98, 0.98}, Live: []bool{true, true, true},
		Shares: []float64{1. / 3, 1. / 3, 1. / 3}}
	v.Held = v.Shares
	got := make([]float64, 3)
	Allocate(got, v, 0.01, 1) // us would rise by 0.01, the others fall by 0.005: all move
	if got[0] <= 1./3+0.009 || got[1] >= 1./3 || got[2] >= 1./3 {
		t.Fatalf("Allocate = %v: want all three shares moved", got)
	}
	v.Demand = []float64{1.02, 0.99, 0.99}
	Allocate(got, v, 0.01, 1) // the largest move is below 0.01: none moves
	if got[0] != 1./3 || got[1] != 1./3 || got[2] != 1./3 {
		t.Fatalf("Allocate = %v: want the shares kept", got)
	}
}
