package demo

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestWriteFrame(t *testing.T) {
	story := Story{Chapters: []Chapter{
		{Title: "Steady", Duration: 10 * time.Second, Text: "Every region sends the same."},
		{Title: "Cut", Duration: 10 * time.Second, Cut: []string{"eu-west"}, Text: strings.Repeat("word ", 40)},
	}}
	half := 0.5
	f := frame{Header: "dashboard http://x/", Story: story, Pos: Position{Round: 2, Chapter: 1, Elapsed: 75 * time.Second},
		Regions: []string{"us-east", "eu-west"}, Limits: []string{"api/per-user", "llm/tokens"}, Interval: time.Second,
		Sample: Sample{Cut: []string{"eu-west"},
			Shares:   map[string][]*float64{"api/per-user": {&half, nil}},
			Admitted: map[string][]float64{"api/per-user": {12.25, 0.5}},
			Rejected: map[string][]float64{"api/per-user": {0, 3}}}}
	var plain bytes.Buffer
	if err := writeFrame(&plain, f, false); err != nil {
		t.Fatal(err)
	}
	out := plain.String()
	for _, want := range []string{"allot demo · round 2 · 1:15 of 0:20 · dashboard http://x/", "Chapter 2 of 2: Cut",
		"eu-west CUT OFF", "api/per-user", "50.0%", "12", "0.5", "3.0", "llm/tokens", "–"} {
		if !strings.Contains(out, want) {
			t.Errorf("plain frame lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("plain frame has escape sequences:\n%q", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len([]rune(line)) > 120 {
			t.Errorf("line of %d runes: %q", len([]rune(line)), line)
		}
	}
	var ansi bytes.Buffer
	f.Final, f.Once = true, true
	writeFrame(&ansi, f, true)
	if !strings.HasPrefix(ansi.String(), ansiClear) || !strings.Contains(ansi.String(), "(the end)") || strings.Contains(ansi.String(), "round") {
		t.Errorf("ANSI frame: want a clear screen first, the end marked, no round when playing once:\n%q", ansi.String())
	}
}

func TestWrapAndClock(t *testing.T) {
	lines := wrap("aaa bbb ccc ddd", 7)
	if strings.Join(lines, "|") != "aaa bbb|ccc ddd" {
		t.Errorf("wrap: %q", lines)
	}
	if got := clock(125 * time.Second); got != "2:05" {
		t.Errorf("clock: %s", got)
	}
}
