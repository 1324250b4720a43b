// Package sketch adapts DataDog's DDSketch to regional.Sketch: the
// summary of recently settled output sizes from which reservations take
// their p90. It lives outside the core (DDSketch brings protobuf along);
// the servers pass New as regional.ReservationOptions.NewSketch.
//
//	rs := regional.NewReservations(engine, enforcer, regional.ReservationOptions{NewSketch: sketch.New})
package sketch

import (
	"github.com/DataDog/sketches-go/ddsketch"

	"github.com/allot-dev/allot/regional"
)

// Accuracy is the relative accuracy of the quantiles: 1%.
const Accuracy = 0.01

// maxBins bounds a sketch's memory (a few KB); past it the lowest bins
// collapse, which leaves the upper quantiles exact to Accuracy.
const maxBins = 512

// DD is a regional.Sketch on a DDSketch whose weights decay. It is not
// safe for concurrent use (regional.Reservations serialises its calls).
type DD struct {
	s *ddsketch.DDSketch
}

var _ regional.Sketch = (*DD)(nil)

// New returns an empty DD.
func New() regional.Sketch {
	s, err := ddsketch.LogCollapsingLowestDenseDDSketch(Accuracy, maxBins)
	if err != nil {
		panic(err) // constant arguments
	}
	return &DD{s: s}
}

// Add implements regional.Sketch. Negative or NaN sizes are ignored.
func (d *DD) Add(v float64) {
	if v >= 0 {
		d.s.Add(v)
	}
}

// Quantile implements regional.Sketch.
func (d *DD) Quantile(q float64) float64 {
	if d.s.IsEmpty() {
		return 0
	}
	v, err := d.s.GetValueAtQuantile(q)
	if err != nil {
		return 0
	}
	return v
}

// Count implements regional.Sketch.
func (d *DD) Count() float64 { return d.s.GetCount() }

// Decay implements regional.Sketch: every weight is multiplied by f, so
// old samples count less than new ones (DDSketch does not know their age).
func (d *DD) Decay(f float64) {
	if f > 0 {
		d.s.Reweight(f)
	}
}
