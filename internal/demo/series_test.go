package demo

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestTally(t *testing.T) {
	var tally Tally
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 100 {
				tally.Add("x", "api/per-user", i%4 != 0)
			}
		})
	}
	tally.Add("y", "llm/tokens", false)
	wg.Wait()
	got := tally.Take()
	if c := got["x"]["api/per-user"]; c.Admitted != 600 || c.Rejected != 200 {
		t.Errorf("x: %+v, want 600 admitted, 200 rejected", c)
	}
	if c := got["y"]["llm/tokens"]; c.Admitted != 0 || c.Rejected != 1 {
		t.Errorf("y: %+v, want 1 rejected", c)
	}
	if again := tally.Take(); len(again) != 0 {
		t.Errorf("second Take: %v, want nothing", again)
	}
}

func TestSeries(t *testing.T) {
	story := threeChapters()
	s := NewSeries([]string{"x", "y"}, story, time.Second, 3)
	smp := s.Add(Reading{At: 2 * time.Second, Window: 2 * time.Second, Position: Position{Round: 1, Chapter: 1},
		Cut:    []string{"x"},
		Limits: []string{"api/b", "api/a"},
		Shares: map[string]map[string]float64{"y": {"api/a": 0.25, "api/b": 0.5, "llm/z": 1}}, // x did not answer
		Counts: map[string]map[string]Count{"x": {"api/a": {Admitted: 10, Rejected: 4}}, "y": {"api/c": {Admitted: 1}}},
	})
	if want := []string{"api/b", "api/a", "api/c", "llm/z"}; !slices.Equal(s.Limits(), want) {
		t.Errorf("limits %v, want %v", s.Limits(), want)
	}
	if got := smp.Admitted["api/a"]; !slices.Equal(got, []float64{5, 0}) {
		t.Errorf("admitted of api/a %v, want [5 0] per second", got)
	}
	if got := smp.Rejected["api/a"]; !slices.Equal(got, []float64{2, 0}) {
		t.Errorf("rejected of api/a %v, want [2 0] per second", got)
	}
	if sh := smp.Shares["api/a"]; sh[0] != nil || sh[1] == nil || *sh[1] != 0.25 {
		t.Errorf("shares of api/a %v, want [unknown 0.25]", sh)
	}
	for i := range 4 {
		s.Add(Reading{At: time.Duration(3+i) * time.Second, Window: time.Second})
	}
	snap := s.Snapshot()
	if len(snap.Samples) != 3 || snap.Samples[0].T != 4 || snap.Samples[2].T != 6 {
		t.Errorf("kept %d samples from t=%v: want the latest 3, t=4…6", len(snap.Samples), snap.Samples[0].T)
	}
	if len(snap.Chapters) != 3 || snap.Chapters[1].Title != "b" || snap.Chapters[1].Seconds != 20 || !slices.Equal(snap.Chapters[1].Cut, []string{"x"}) {
		t.Errorf("chapters %+v", snap.Chapters)
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"regions":["x","y"]`, `"interval":1`, `"shares":{"api/a":[null,null]`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("JSON lacks %s: %s", want, data)
		}
	}
}
