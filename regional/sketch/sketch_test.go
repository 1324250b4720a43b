package sketch

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestQuantileWithinAccuracy(t *testing.T) {
	s := New()
	if s.Quantile(0.9) != 0 || s.Count() != 0 {
		t.Fatal("empty sketch")
	}
	r := rand.New(rand.NewPCG(1, 2))
	var xs []float64
	for range 20000 {
		x := math.Round(250 * math.Exp(r.NormFloat64())) // log-normal output sizes
		xs = append(xs, x)
		s.Add(x)
	}
	if s.Count() != 20000 {
		t.Fatalf("count %v", s.Count())
	}
	w := &window{xs}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		got, want := s.Quantile(q), w.quantile(q)
		if math.Abs(got-want) > Accuracy*want+1 {
			t.Errorf("q%.2f = %.1f, exact %.1f", q, got, want)
		}
	}
}

// Decay halves the weight of what was there: new samples then weigh
// twice as much in the quantile.
func TestDecay(t *testing.T) {
	s := New()
	for range 100 {
		s.Add(100)
	}
	s.Decay(0.5)
	if s.Count() != 50 {
		t.Fatalf("count %v after decay", s.Count())
	}
	for range 60 {
		s.Add(1000)
	}
	if p := s.Quantile(0.5); math.Abs(p-1000) > 10 {
		t.Fatalf("median %v: 60 new samples outweigh 100 halved ones", p)
	}
	s.Add(-1)
	s.Add(math.NaN())
	if s.Count() != 110 {
		t.Fatalf("bad samples counted: %v", s.Count())
	}
}

type window struct{ xs []float64 }

func (w *window) quantile(q float64) float64 {
	ys := append([]float64(nil), w.xs...)
	slices.Sort(ys)
	return ys[int(math.Ceil(q*float64(len(ys))))-1]
}
