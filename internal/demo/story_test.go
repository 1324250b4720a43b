package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot"
)

func threeChapters() Story {
	return Story{Chapters: []Chapter{
		{Title: "a", Duration: 10 * time.Second},
		{Title: "b", Duration: 20 * time.Second, Cut: []string{"x"}},
		{Title: "c", Duration: 5 * time.Second},
	}}
}

func TestStoryAt(t *testing.T) {
	s := threeChapters()
	const sec = time.Second
	for _, tc := range []struct {
		at      time.Duration
		once    bool
		round   int
		chapter int
		into    time.Duration
		done    bool
	}{
		{at: -sec, round: 1, chapter: 0, into: 0},
		{at: 0, round: 1, chapter: 0, into: 0},
		{at: 9 * sec, round: 1, chapter: 0, into: 9 * sec},
		{at: 10 * sec, round: 1, chapter: 1, into: 0},
		{at: 29 * sec, round: 1, chapter: 1, into: 19 * sec},
		{at: 30 * sec, round: 1, chapter: 2, into: 0},
		{at: 34 * sec, round: 1, chapter: 2, into: 4 * sec},
		{at: 35 * sec, round: 2, chapter: 0, into: 0},
		{at: 46 * sec, round: 2, chapter: 1, into: sec},
		{at: 34 * sec, once: true, round: 1, chapter: 2, into: 4 * sec},
		{at: 35 * sec, once: true, round: 1, chapter: 2, into: 5 * sec, done: true},
		{at: time.Hour, once: true, round: 1, chapter: 2, into: 5 * sec, done: true},
	} {
		p := s.At(tc.at, tc.once)
		if p.Round != tc.round || p.Chapter != tc.chapter || p.Into != tc.into || p.Done != tc.done {
			t.Errorf("At(%v, once=%v) = %+v, want round %d chapter %d into %v done %v", tc.at, tc.once, p, tc.round, tc.chapter, tc.into, tc.done)
		}
	}
	if p := (Story{}).At(time.Second, false); !p.Done {
		t.Errorf("a story without chapters: %+v, want done", p)
	}
}

func TestStoryScaled(t *testing.T) {
	s := threeChapters()
	s.Chapters[0].Flows = []Flow{{Name: "llm", LLM: &LLM{MaxTokens: 10, Hold: 2 * time.Second}, Rates: map[string]float64{"x": 4}}}
	f := s.Scaled(4)
	if got, want := f.Total(), s.Total()/4; got != want {
		t.Errorf("total %v, want %v", got, want)
	}
	if got := f.Chapters[0].Flows[0].LLM.Hold; got != 500*time.Millisecond {
		t.Errorf("hold %v, want 500ms", got)
	}
	if got := f.Chapters[0].Flows[0].Rates["x"]; got != 4 {
		t.Errorf("rate %v, want 4: rates do not scale", got)
	}
	if s.Chapters[0].Duration != 10*time.Second || s.Chapters[0].Flows[0].LLM.Hold != 2*time.Second {
		t.Errorf("Scaled changed the original: %+v", s.Chapters[0])
	}
}

func TestDefaultStory(t *testing.T) {
	regions := []string{"us-east", "eu-west", "ap-south"}
	s := DefaultStory(regions)
	if err := s.Validate(regions); err != nil {
		t.Fatal(err)
	}
	if total := s.Total(); total < time.Minute || total > 3*time.Minute {
		t.Errorf("total %v, want a couple of minutes", total)
	}
	// The story's beats: a shift of demand from the first region to the
	// second, the third cut off then healed, a burst of reservations.
	var shifted, cut, healed, burst bool
	for i, c := range s.Chapters {
		for _, f := range c.Flows {
			if f.Name == "user 42" && f.Rates["eu-west"] > 2*f.Rates["us-east"] {
				shifted = true
			}
			if f.LLM != nil && f.Rates["us-east"] >= 20 {
				burst = true
			}
		}
		if len(c.Cut) == 1 && c.Cut[0] == "ap-south" {
			cut = true
			healed = i+1 < len(s.Chapters) && len(s.Chapters[i+1].Cut) == 0
		}
	}
	if !shifted || !cut || !healed || !burst {
		t.Errorf("shift %v, cut %v, healed %v, LLM burst %v: want all", shifted, cut, healed, burst)
	}
	one := DefaultStory([]string{"solo"})
	if err := one.Validate([]string{"solo"}); err != nil || len(one.Chapters) != 1 {
		t.Errorf("one region: %d chapters, %v; want one valid chapter", len(one.Chapters), err)
	}
}

func TestStoryValidate(t *testing.T) {
	regions := []string{"x", "y"}
	flow := func(f Flow) Story {
		return Story{Chapters: []Chapter{{Title: "c", Duration: time.Second, Flows: []Flow{f}}}}
	}
	for name, tc := range map[string]struct {
		s    Story
		want string
	}{
		"no chapter":     {Story{}, "no chapter"},
		"no duration":    {Story{Chapters: []Chapter{{Title: "c"}}}, "duration"},
		"unknown cut":    {Story{Chapters: []Chapter{{Title: "c", Duration: time.Second, Cut: []string{"z"}}}}, `unknown region "z"`},
		"unknown rate":   {flow(Flow{Name: "f", Rates: map[string]float64{"z": 1}}), `unknown region "z"`},
		"negative rate":  {flow(Flow{Name: "f", Rates: map[string]float64{"x": -1}}), "want ≥ 0"},
		"spread no keys": {flow(Flow{Name: "f", Spread: "user", Descriptor: allot.Descriptor{{Key: "user", Value: "u"}}}), "keys"},
		"bad tokens":     {flow(Flow{Name: "f", LLM: &LLM{MaxTokens: 10, OutMin: 5, OutMax: 1}}), "token shape"},
	} {
		err := tc.s.Validate(regions)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}
