// Package report draws a simulation's plots (gonum/plot): it is apart
// from package sim so that the simulator's core imports only allot's
// cores and the standard library.
package report

import (
	"bytes"
	"fmt"
	"image/color"

	"github.com/allot-dev/allot/sim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plots returns PNG plots of res by file name: shares.png (every region's
// share of the watched key over time, under allot) and admitted.png (the
// watched key's admitted per window: per region under allot, and the
// global total of every system, against L).
func Plots(res *sim.Result) (map[string][]byte, error) {
	out := map[string][]byte{}
	allot := res.System(sim.Allot)
	if allot == nil {
		return out, nil
	}
	p := plot.New()
	p.Title.Text = res.Scenario + ": shares of key " + res.Watch + " (allot)"
	p.X.Label.Text, p.Y.Label.Text = "time (s)", "share"
	var lines []any
	for r, name := range res.Regions {
		xy := make(plotter.XYs, len(allot.ShareTimes))
		for i, t := range allot.ShareTimes {
			xy[i] = plotter.XY{X: t.Seconds(), Y: allot.Shares[i][r]}
		}
		lines = append(lines, name, xy)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	if err := png(out, "shares.png", p); err != nil {
		return nil, err
	}

	p = plot.New()
	p.Title.Text = fmt.Sprintf("%s: admitted per %gs window, key %s (L = %g)", res.Scenario, res.WindowS, res.Watch, res.L)
	p.X.Label.Text, p.Y.Label.Text = "time (s)", "admitted"
	lines = lines[:0]
	for r, name := range res.Regions {
		lines = append(lines, "allot "+name, windows(res, allot, r))
	}
	for i := range res.Systems {
		f := &res.Systems[i]
		lines = append(lines, f.System+" total", windows(res, f, -1))
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return nil, err
	}
	limit := plotter.NewFunction(func(float64) float64 { return res.L })
	limit.Color, limit.Dashes = color.Black, []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(limit)
	p.Legend.Add("L", limit)
	if err := png(out, "admitted.png", p); err != nil {
		return nil, err
	}
	return out, nil
}

// windows returns region r's admitted per window of f, or the total for r < 0.
func windows(res *sim.Result, f *sim.Figures, r int) plotter.XYs {
	xy := make(plotter.XYs, len(f.HotWindows))
	for w, byRegion := range f.HotWindows {
		y := 0.0
		for i, n := range byRegion {
			if r < 0 || i == r {
				y += n
			}
		}
		xy[w] = plotter.XY{X: float64(w) * res.WindowS, Y: y}
	}
	return xy
}

func png(out map[string][]byte, name string, p *plot.Plot) error {
	p.Legend.Top = true
	w, err := p.WriterTo(9*vg.Inch, 4.5*vg.Inch, "png")
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return err
	}
	out[name] = b.Bytes()
	return nil
}
